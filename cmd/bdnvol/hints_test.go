package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/retention"
	"github.com/bdnvol/bdnvol/pkg/source"
)

// TestFlagHint: library sentinels, wrapped, get the flag that gets past
// them; other errors get nothing.
func TestFlagHint(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("rm x: %w", retention.ErrStillNeeded), " (--force deletes it anyway)"},
		{fmt.Errorf("x: %w", retention.ErrNoTombstone), " (bdnvol versions --deleted lists what can be restored)"},
		{fmt.Errorf("x: %w", retention.ErrNoDigest), " (bdnvol versions --deleted lists what can be restored)"},
		{fmt.Errorf("sync: %w", source.ErrEmpty), " (after --include/--exclude)"},
		{errors.New("other"), ""},
	} {
		if got := flagHint(c.err); got != c.want {
			t.Errorf("flagHint(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
