package main

import (
	"strings"
	"testing"
	"time"
)

// TestProgressLineClamps: processed bytes past the total (or below zero)
// draw a full (or empty) bar instead of panicking.
func TestProgressLineClamps(t *testing.T) {
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
		line := progressLine("pull", c.total, c.proc, 10, 0)
		if !strings.Contains(line, c.pct) || strings.Count(line, "█")+strings.Count(line, "░") != 20 {
			t.Errorf("total %d, processed %d: %q", c.total, c.proc, line)
		}
	}
	if line := progressLine("pull", 1, 1, 1<<20, time.Second); !strings.Contains(line, "1.0 MiB/s") {
		t.Errorf("rate: %q", line)
	}
}
