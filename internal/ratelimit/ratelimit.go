// Package ratelimit paces bytes to a rate shared by every transfer of a
// command (pull, push, copy and sync's --max-rate) or of the warm list
// (--warm-bandwidth).
package ratelimit

import (
	"context"
	"io"
	"sync"
	"time"
)

// Limiter paces bytes to a rate: each Wait reserves its bytes' share of
// time after the reservations before it. Time the reservations fell behind
// the clock (a waiter woken late, a reader slow to ask again) is made up
// for, up to catchUp, so that a long transfer holds the rate rather than
// falling short of it; a longer pause earns no more credit. It is safe for concurrent use; a
// nil Limiter never waits.
type Limiter struct {
	rate float64 // bytes per second

	now   func() time.Time
	until func(ctx context.Context, now, at time.Time) error // sleeps from now until at

	mu   sync.Mutex
	next time.Time
}

// New returns a limiter of bytesPerSecond; nil (no bound) when <= 0.
func New(bytesPerSecond int64) *Limiter {
	if bytesPerSecond <= 0 {
		return nil
	}
	return &Limiter{rate: float64(bytesPerSecond), now: time.Now, until: sleepUntil}
}

// Rate is the bound in bytes per second; 0 for a nil Limiter.
func (l *Limiter) Rate() int64 {
	if l == nil {
		return 0
	}
	return int64(l.rate)
}

// Wait blocks until n more bytes fit the rate: until the end of the
// reservations before it. It returns early with ctx's error.
func (l *Limiter) Wait(ctx context.Context, n int64) error {
	if l == nil {
		return ctx.Err()
	}
	l.mu.Lock()
	now := l.now()
	switch {
	case l.next.IsZero():
		l.next = now
	case l.next.Before(now.Add(-catchUp)):
		// Idle: no credit for it beyond catchUp.
		l.next = now.Add(-catchUp)
	}
	at := l.next
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	l.mu.Unlock()
	if at.After(now) {
		return l.until(ctx, now, at)
	}
	return ctx.Err()
}

func sleepUntil(ctx context.Context, now, at time.Time) error {
	t := time.NewTimer(at.Sub(now))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// catchUp is the most time a Limiter makes up for: at most its bytes move
// in a burst after a pause.
const catchUp = 250 * time.Millisecond

// maxRead is the most one Read of a paced reader asks for: the bytes a
// burst may move ahead of the rate.
const maxRead = 32 << 10

// Reader returns rc paced by l: each Read of at most 32 KiB waits for the
// bytes before it to fit the rate, so a body's bytes leave or arrive no
// faster than l allows in total with every other reader of l. A nil l
// returns rc.
func (l *Limiter) Reader(ctx context.Context, rc io.ReadCloser) io.ReadCloser {
	if l == nil || rc == nil {
		return rc
	}
	return &reader{rc: rc, l: l, ctx: ctx}
}

// reader is a ReadCloser paced by a Limiter. It keeps its request's
// context: a Read is the request's own work, ended with it.
type reader struct {
	rc  io.ReadCloser
	l   *Limiter
	ctx context.Context
}

func (r *reader) Read(p []byte) (int, error) {
	if len(p) > maxRead {
		p = p[:maxRead]
	}
	n, err := r.rc.Read(p)
	if n > 0 {
		if werr := r.l.Wait(r.ctx, int64(n)); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}

func (r *reader) Close() error { return r.rc.Close() }
