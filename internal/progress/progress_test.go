package progress

import (
	"strings"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// TestLineClamps: processed bytes past the total (or below zero) draw a
// full (or empty) bar instead of panicking.
func TestLineClamps(t *testing.T) {
	for _, c := range []struct {
		total, proc int64
		pct         string
	}{
		{100, 250, "100.0%"},
		{100, 100, "100.0%"},
		{100, 50, " 50.0%"},
		{100, -5, "  0.0%"},
		{0, 10, "  0.0%"},
	} {
		line := Line("pull", c.total, c.proc, 10, 0)
		if !strings.Contains(line, c.pct) || strings.Count(line, "█")+strings.Count(line, "░") != 20 {
			t.Errorf("total %d, processed %d: %q", c.total, c.proc, line)
		}
	}
	if line := Line("pull", 1, 1, 1<<20, time.Second); !strings.Contains(line, "1.0 MiB/s") || !strings.Contains(line, "fetched") {
		t.Errorf("pull: %q", line)
	}
	if line := Line("push", 1, 1, 1, time.Second); !strings.Contains(line, "uploaded") {
		t.Errorf("push: %q", line)
	}
}

func TestStartDrawsOnlyOnATerminalAndClearsTheLine(t *testing.T) {
	var w testutil.SyncBuffer
	// Not a terminal: nothing is drawn.
	Start(&w, "push", func() (int64, int64, int64) { return 10, 5, 5 })()
	if w.String() != "" {
		t.Fatalf("drew %q on a non-terminal", w.String())
	}
	stop := start(&w, "push", func() (int64, int64, int64) { return 10, 5, 5 }, time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(w.String(), " 50.0% ") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	stop()
	out := w.String()
	if !strings.HasPrefix(out, "\r\033[Kpush ") || !strings.Contains(out, " 50.0% ") || !strings.HasSuffix(out, "\r\033[K") {
		t.Errorf("drawn %q", out)
	}
}
