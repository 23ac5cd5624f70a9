package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/bdnvol/bdnvol/pkg/metrics"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// serveMetrics serves /metrics (and /warm when w is set) at addr until ctx
// ends. It fails at once when addr cannot be listened on.
func serveMetrics(ctx context.Context, addr string, m *metrics.Metrics, w *warm.Warmer, log *slog.Logger) error {
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
