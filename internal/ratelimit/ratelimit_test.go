package ratelimit

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock that moves only when the limiter sleeps: to the
// end of the latest sleep (sleeps of concurrent waiters overlap).
type fakeClock struct {
	mu    sync.Mutex
	t     time.Time
	slept time.Duration // the clock's advance by sleeps
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) until(ctx context.Context, _, at time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.After(c.t) {
		c.slept += at.Sub(c.t)
		c.t = at
	}
	return ctx.Err()
}

func fake(rate int64) (*Limiter, *fakeClock) {
	c := &fakeClock{t: time.Unix(1e9, 0)}
	l := New(rate)
	l.now, l.until = c.now, c.until
	return l, c
}

// Bytes read through paced readers, from several goroutines at once, take
// their total over the rate (less the last read's share, paid by whoever
// reads next), whatever their interleaving.
func TestReaderPacesTotal(t *testing.T) {
	const rate = 20 << 20
	l, c := fake(rate)
	ctx := context.Background()
	var wg sync.WaitGroup
	const readers, size = 4, 50 << 20
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc := l.Reader(ctx, io.NopCloser(bytes.NewReader(make([]byte, size+i))))
			if _, err := io.Copy(io.Discard, rc); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	total := float64(readers*size + 6)
	want := time.Duration(total / rate * float64(time.Second))
	if got := c.slept; got < want-2*time.Millisecond || got > want {
		t.Fatalf("%v of sleep for %.0f bytes at %d B/s, want %v (within the last 32 KiB's share)", got, total, rate, want)
	}
}

// A pause earns credit for at most catchUp: after an idle hour, the first
// catchUp's worth of bytes go at once and the rest are paced.
func TestWaitBoundedCreditForIdle(t *testing.T) {
	l, c := fake(1 << 20)
	ctx := context.Background()
	if err := l.Wait(ctx, 1<<20); err != nil || c.slept != 0 {
		t.Fatalf("first wait: %v, slept %v; want no wait", err, c.slept)
	}
	c.t = c.t.Add(time.Hour)
	for range 3 {
		if err := l.Wait(ctx, 512<<10); err != nil {
			t.Fatal(err)
		}
	}
	if want := time.Second - catchUp; c.slept != want {
		t.Fatalf("3 x 512 KiB at 1 MiB/s after an idle hour slept %v, want %v", c.slept, want)
	}
}

// A reader slow to ask again (or woken late) does not slow the rate: the
// time lost is made up by the next reservations.
func TestWaitMakesUpLostTime(t *testing.T) {
	l, c := fake(1 << 20)
	ctx := context.Background()
	start := c.t
	wait := func() {
		if err := l.Wait(ctx, 256<<10); err != nil { // 250ms at 1 MiB/s
			t.Fatal(err)
		}
	}
	wait()
	c.t = c.t.Add(450 * time.Millisecond) // 200ms later than its reservation allowed
	wait()
	wait()
	if got := c.t.Sub(start); got != 500*time.Millisecond {
		t.Fatalf("the third reservation of 250ms started at %v, want 500ms", got)
	}
}

// The real clock, with a generous bound: three reservations of 100 KiB at
// 1 MiB/s; the third starts after the first two's 200 KiB.
func TestWaitRealClock(t *testing.T) {
	l := New(1 << 20)
	ctx := context.Background()
	start := time.Now()
	for range 3 {
		if err := l.Wait(ctx, 100<<10); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("3 x 100 KiB at 1 MiB/s took %v, want >= ~195ms", d)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Wait(cctx, 1<<30); err == nil {
		t.Fatal("a cancelled wait returned nil")
	}
}

func TestNilLimiter(t *testing.T) {
	ctx := context.Background()
	if New(0) != nil || (*Limiter)(nil).Wait(ctx, 1<<40) != nil || New(-1).Rate() != 0 {
		t.Fatal("no rate must mean no limiter")
	}
	rc := io.NopCloser(bytes.NewReader(nil))
	if (*Limiter)(nil).Reader(ctx, rc) != rc {
		t.Fatal("a nil limiter wraps readers")
	}
}
