// Package signals turns SIGINT and SIGTERM into a context: the first
// cancels it, so work stops cleanly; the second is handed to the caller,
// to exit at once when work is stuck where a context does not reach.
package signals

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Context returns a context that the first SIGINT or SIGTERM cancels; a
// second one calls again with it. stop releases the signals and cancels
// the context.
func Context(again func(os.Signal)) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-done:
			return
		}
		select {
		case s := <-sigs:
			again(s)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}

// ExitCode is the exit status of a process ended by s: 128 + its number.
func ExitCode(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 130
}
