package retention

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/pkg/versions"
)

func TestDurationFlag(t *testing.T) {
	var d Duration
	if err := d.UnmarshalText([]byte("1d12h")); err != nil || time.Duration(d) != 36*time.Hour {
		t.Errorf("1d12h: %v, %v", time.Duration(d), err)
	}
	if err := d.UnmarshalText([]byte("7x")); err == nil || !strings.Contains(err.Error(), `"7x"`) {
		t.Errorf("7x: %v, want an error naming it", err)
	}
	if time.Duration(d) != 36*time.Hour {
		t.Errorf("a failed parse changed the value to %v", time.Duration(d))
	}
}

func TestParseRestoreRef(t *testing.T) {
	d := "sha256:" + strings.Repeat("b", 64)
	for _, c := range [][2]string{{"reg.example/vol@" + d, ""}, {"reg.example/vol", d}} {
		ref, err := ParseRestoreRef(c[0], c[1])
		if err != nil || ref.Digest.String() != d || ref.Repo() != "reg.example/vol" {
			t.Errorf("%q %q: %+v, %v", c[0], c[1], ref, err)
		}
	}
	if _, err := ParseRestoreRef(d, ""); !errors.Is(err, ErrNoRepository) || !strings.Contains(err.Error(), d) {
		t.Errorf("digest alone: %v", err)
	}
	if _, err := ParseRestoreRef("reg.example/vol:v1", ""); !errors.Is(err, ErrNoDigest) {
		t.Errorf("a tag: %v", err)
	}
	if _, err := ParseRestoreRef("reg.example/vol", ""); !errors.Is(err, versions.ErrNoVersion) {
		t.Errorf("repository alone: %v", err)
	}
}
