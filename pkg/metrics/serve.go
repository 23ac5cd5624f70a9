package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"

	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// Serve serves /metrics (and /warm when w is set) at addr until ctx ends.
// It fails at once when addr cannot be listened on.
func Serve(ctx context.Context, addr string, m *Metrics, w *warm.Warmer, log *slog.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	if w != nil {
		mux.Handle("GET /warm", w.Handler())
	}
	srv := &http.Server{Handler: mux}
	go func() { <-ctx.Done(); srv.Close() }()
	go srv.Serve(l)
	log.Info("serving metrics", "addr", l.Addr().String())
	return nil
}

// Samples counts the mounts of each digest in digests (one entry per mount).
func Samples(digests []string) []MountSample {
	n := map[string]int{}
	var out []MountSample
	for _, d := range digests {
		if n[d] == 0 {
			out = append(out, MountSample{Digest: d})
		}
		n[d]++
	}
	for i := range out {
		out[i].Pods = n[out[i].Digest]
	}
	return out
}

// MountMetrics are the metrics of one `bdnvol mount` process.
type MountMetrics struct {
	m       *Metrics
	samples atomic.Pointer[[]MountSample]
}

// ServeMount serves the metrics of a mount process reading through cache
// at addr until ctx ends. An empty addr serves nothing: the result is nil,
// and its methods do nothing.
func ServeMount(ctx context.Context, addr string, cache *chunkcache.Cache, log *slog.Logger) (*MountMetrics, error) {
	if addr == "" {
		return nil, nil
	}
	mm := &MountMetrics{m: New()}
	mm.m.Cache(cache)
	// A user's own mount process: its digests are the user's own.
	mm.m.Mounts(func() []MountSample {
		if p := mm.samples.Load(); p != nil {
			return *p
		}
		return nil
	}, true)
	if err := Serve(ctx, addr, mm.m, nil, log); err != nil {
		return nil, err
	}
	return mm, nil
}

// Wrap returns the function that instruments registry fetchers; nil for
// none.
func (mm *MountMetrics) Wrap() func(source, host string, f content.Fetcher) content.Fetcher {
	if mm == nil {
		return nil
	}
	return mm.m.Wrap
}

// SetMounts records the digests served, one per mount.
func (mm *MountMetrics) SetMounts(digests []string) {
	if mm == nil {
		return
	}
	ss := Samples(digests)
	mm.samples.Store(&ss)
}
