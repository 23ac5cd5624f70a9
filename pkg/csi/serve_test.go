package csi

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// umask0 runs the test under umask 0, as a careless init might.
func umask0(t *testing.T) {
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
}

func TestServeMounterServesSocketMetricsAndWarmUntilCanceled(t *testing.T) {
	umask0(t)
	dir := t.TempDir()
	list := filepath.Join(dir, "warm.list")
	os.WriteFile(list, nil, 0o644)
	cfg := MounterProcess{
		Socket: filepath.Join(dir, "m.sock"), MountsDir: filepath.Join(dir, "mounts"), StateDir: filepath.Join(dir, "state"),
		CacheDir: filepath.Join(dir, "cache"), CacheSize: 1 << 20, WarmList: list, WarmResolveInterval: time.Minute,
		WarmJobs: 1, Jobs: 1, FetchTimeout: time.Second, MetricsAddr: freeAddr(t), MetricsDigests: true,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ServeMounter(ctx, cfg) }()
	client := NewMounterClient(cfg.Socket)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ms, err := client.List(ctx)
		if err == nil {
			if len(ms) != 0 {
				t.Fatalf("a new mounter serves %v", ms)
			}
			break
		}
		select {
		case err := <-done:
			t.Fatalf("ServeMounter ended: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mounter never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(cfg.CacheDir, "chunks")); err != nil {
		t.Errorf("cache not under CACHE-DIR/chunks: %v", err)
	}
	if fi, err := os.Stat(cfg.Socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mounter socket under umask 0: %v, %v; want mode 0600", fi.Mode(), err)
	}
	if code, body := get(t, "http://"+cfg.MetricsAddr+"/metrics"); code != 200 || !strings.Contains(body, "bdnvol_") {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	if code, _ := get(t, "http://"+cfg.MetricsAddr+"/warm"); code != 200 {
		t.Errorf("/warm with a warm list and --metrics-digests: %d", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeMounter: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ServeMounter did not return after its context ended")
	}
}

func TestServeNodeDefaultsNodeIDToHostName(t *testing.T) {
	umask0(t)
	sock := filepath.Join(t.TempDir(), "csi.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ServeNode(ctx, "unix://"+sock, NodeOptions{Version: "v9", StateDir: t.TempDir(),
			Mounter: NewMounterClient(filepath.Join(t.TempDir(), "none.sock"))})
	}()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(cctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	if err != nil || info.VendorVersion != "v9" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("CSI socket under umask 0: %v, %v; want mode 0600", fi.Mode(), err)
	}
	host, _ := os.Hostname()
	ni, err := csi.NewNodeClient(conn).NodeGetInfo(cctx, &csi.NodeGetInfoRequest{})
	if err != nil || ni.NodeId != host {
		t.Fatalf("NodeGetInfo = %v, %v; want node id %q", ni, err, host)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeNode: %v", err)
	}
}

func TestMounterConfigChunksDirDefaults(t *testing.T) {
	if got, want := (MounterProcess{}).chunksDir(), "/var/lib/bdnvol/cache/chunks"; got != want {
		t.Errorf("no cache dir: chunks in %s, want %s", got, want)
	}
	if got, want := (MounterProcess{CacheDir: "/srv/c"}).chunksDir(), "/srv/c/chunks"; got != want {
		t.Errorf("cache dir /srv/c: chunks in %s, want %s", got, want)
	}
}
