package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Size is a byte count that parses suffixes such as KiB, MiB and GiB.
type Size int64

// UnmarshalText parses a size such as 4096, 64KiB or 8MiB.
func (s *Size) UnmarshalText(b []byte) error {
	n, err := units.ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// startProgress draws a progress line on w while work runs, if w is a
// terminal; the returned function stops it and clears the line.
func startProgress(w io.Writer, verb string, c *layout.Counters) func() {
	if !isTTY(w) {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				fmt.Fprint(w, "\r\033[K")
				return
			case <-tick.C:
				total, proc, sent := c.Total.Load(), c.Processed.Load(), c.Sent.Load()
				fmt.Fprint(w, "\r\033[K"+progressLine(verb, total, proc, sent, time.Since(start)))
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// progressLine is one frame of the progress line. Processed bytes beyond
// the total (a count that went wrong) show as 100%, never a broken bar.
func progressLine(verb string, total, proc, sent int64, elapsed time.Duration) string {
	pct := 0.0
	if total > 0 {
		pct = 100 * float64(proc) / float64(total)
	}
	pct = min(max(pct, 0), 100)
	rate := 0.0
	if secs := elapsed.Seconds(); secs > 0 {
		rate = float64(sent) / secs
	}
	full := int(pct / 5)
	bar := strings.Repeat("█", full) + strings.Repeat("░", 20-full)
	net := "uploaded"
	if verb == "pull" {
		net = "fetched"
	}
	return fmt.Sprintf("%s %s %5.1f%% %s / %s, %s %s (%s/s)", verb, bar, pct,
		units.Bytes(proc), units.Bytes(total), net, units.Bytes(sent), units.Bytes(int64(rate)))
}
