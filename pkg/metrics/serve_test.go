package metrics

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
)

func TestSamplesCountsMountsPerDigest(t *testing.T) {
	got := Samples([]string{"sha256:a", "sha256:b", "sha256:a"})
	if len(got) != 2 || got[0] != (MountSample{"sha256:a", 2}) || got[1] != (MountSample{"sha256:b", 1}) {
		t.Errorf("Samples = %+v", got)
	}
	if got := Samples(nil); len(got) != 0 {
		t.Errorf("Samples(nil) = %+v", got)
	}
}

func TestServeMetricsUntilCanceled(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	// An address in use fails at once, naming it.
	if err := Serve(context.Background(), addr, New(), nil, log); err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("Serve on a used address = %v", err)
	}
	l.Close()
	m := New()
	m.Mounts(func() []MountSample { return []MountSample{{"sha256:abc", 1}} }, true)
	ctx, cancel := context.WithCancel(context.Background())
	if err := Serve(ctx, addr, m, nil, log); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `bdnvol_pods{digest="sha256:abc"} 1`) {
		t.Errorf("/metrics lacks the mount sample:\n%s", b)
	}
	if resp, err := http.Get("http://" + addr + "/warm"); err == nil {
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("/warm without a warmer: %s", resp.Status)
		}
		resp.Body.Close()
	}
	cancel()
}

func TestServeMountReportsTheMountsSet(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cache, err := chunkcache.Open(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// No address: nothing served, and the nil result does nothing.
	mm, err := ServeMount(context.Background(), "", cache, log)
	if err != nil || mm != nil || mm.Wrap() != nil {
		t.Fatalf("no address: %v, %v", mm, err)
	}
	mm.SetMounts([]string{"sha256:a"})

	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if mm, err = ServeMount(ctx, addr, cache, log); err != nil || mm.Wrap() == nil {
		t.Fatalf("ServeMount: %v", err)
	}
	mm.SetMounts([]string{"sha256:d1", "sha256:d1"})
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `bdnvol_pods{digest="sha256:d1"} 2`) || !strings.Contains(string(b), "bdnvol_cache_") {
		t.Errorf("/metrics:\n%s", b)
	}
}
