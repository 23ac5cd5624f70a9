// Package progress draws a one-line progress bar on a terminal while work
// runs: percentage done, bytes processed of the total, bytes sent and rate.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/bdnvol/bdnvol/internal/units"
)

// Counts returns the bytes of the work in total, processed so far and sent
// (uploaded or fetched) so far.
type Counts func() (total, processed, sent int64)

// Interval is how often the line is redrawn.
const Interval = 200 * time.Millisecond

// Start draws the progress line of verb on w every Interval, if w is a
// terminal; the returned function stops it and clears the line.
func Start(w io.Writer, verb string, counts Counts) func() {
	if f, ok := w.(*os.File); !ok || !term.IsTerminal(int(f.Fd())) {
		return func() {}
	}
	return start(w, verb, counts, Interval)
}

func start(w io.Writer, verb string, counts Counts, every time.Duration) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		start := time.Now()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				fmt.Fprint(w, "\r\033[K")
				return
			case <-tick.C:
				total, proc, sent := counts()
				fmt.Fprint(w, "\r\033[K"+Line(verb, total, proc, sent, time.Since(start)))
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// Line is one frame of the progress line. Processed bytes beyond the total
// (a count that went wrong) show as 100%, never a broken bar.
func Line(verb string, total, proc, sent int64, elapsed time.Duration) string {
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
