package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"

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
