package warm

import (
	"context"
	"sync"
	"time"
)

// Limiter paces bytes to a rate: each Wait reserves its bytes' share of
// time after the reservations before it.
type Limiter struct {
	rate float64 // bytes per second

	mu   sync.Mutex
	next time.Time
}

// NewLimiter returns a limiter of bytesPerSecond; nil (no bound) when <= 0.
func NewLimiter(bytesPerSecond int64) *Limiter {
	if bytesPerSecond <= 0 {
		return nil
	}
	return &Limiter{rate: float64(bytesPerSecond)}
}

// Wait blocks until n more bytes fit the rate. A nil Limiter never waits.
func (l *Limiter) Wait(ctx context.Context, n int64) error {
	if l == nil {
		return ctx.Err()
	}
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	at := l.next
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	l.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
