package profile

import (
	"context"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Window bounds a start window: how long the reads that start a workload
// are recorded. Zero values select defaults.
type Window struct {
	// Quiet ends the window when no chunk has been read for the first
	// time for this long, counted from the first read; <= 0 means 10s.
	Quiet time.Duration
	// MaxTime ends the window this long after the recorder was made;
	// <= 0 means 10 minutes.
	MaxTime time.Duration
	// MaxChunks ends the window once this many chunks are recorded;
	// <= 0 or more than the package's MaxChunks means MaxChunks.
	MaxChunks int
}

// Recorder notes the chunks of a volume in first-read order during a start
// window. Its Read method is the lazy volume's read hook; it is safe for
// concurrent use.
type Recorder struct {
	opt   Window
	start time.Time
	now   func() time.Time

	mu      sync.Mutex
	order   []int
	seen    map[int]bool
	last    time.Time // of the last new chunk; zero before the first
	stopped bool
	done    chan struct{}
}

// NewRecorder returns a recorder whose window starts now.
func NewRecorder(opt Window) *Recorder {
	if opt.Quiet <= 0 {
		opt.Quiet = 10 * time.Second
	}
	if opt.MaxTime <= 0 {
		opt.MaxTime = 10 * time.Minute
	}
	if opt.MaxChunks <= 0 || opt.MaxChunks > MaxChunks {
		opt.MaxChunks = MaxChunks
	}
	return &Recorder{opt: opt, start: time.Now(), now: time.Now, seen: map[int]bool{}, done: make(chan struct{})}
}

// Read records that chunk k was read, if it is the first read of k and the
// window is open.
func (r *Recorder) Read(k int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || r.seen[k] {
		return
	}
	now := r.now()
	if now.Sub(r.start) >= r.opt.MaxTime || !r.last.IsZero() && now.Sub(r.last) >= r.opt.Quiet {
		r.stopLocked()
		return
	}
	r.seen[k] = true
	r.order = append(r.order, k)
	r.last = now
	if len(r.order) >= r.opt.MaxChunks {
		r.stopLocked()
	}
}

// Stop closes the window; later reads are not recorded.
func (r *Recorder) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopLocked()
}

func (r *Recorder) stopLocked() {
	if !r.stopped {
		r.stopped = true
		close(r.done)
	}
}

// Wait returns when the window closes: reads paused for Quiet after the
// first, MaxTime passed, MaxChunks were recorded, Stop was called, or ctx
// is done (then with its error).
func (r *Recorder) Wait(ctx context.Context) error {
	tick := time.NewTicker(min(r.opt.Quiet, r.opt.MaxTime) / 8)
	defer tick.Stop()
	for {
		select {
		case <-r.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		r.mu.Lock()
		now := r.now()
		if now.Sub(r.start) >= r.opt.MaxTime || !r.last.IsZero() && now.Sub(r.last) >= r.opt.Quiet {
			r.stopLocked()
		}
		r.mu.Unlock()
	}
}

// Chunks returns the indices recorded so far, in first-read order.
func (r *Recorder) Chunks() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.order...)
}

// Profile returns the profile of ver the recorder holds: the digests of
// the chunks recorded, in first-read order, each once (two chunk indices
// of one blob count once).
func (r *Recorder) Profile(ver *layout.Version) *Profile {
	seen := map[digest.Digest]bool{}
	var out []digest.Digest
	for _, k := range r.Chunks() {
		if k < 0 || k >= ver.NumChunks() {
			continue
		}
		d := ver.Index.ChunkDigest(k)
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return New(ver.Root.Digest, out)
}
