package csi

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// TestNodeUnmountHoldsNoLock: while the mounter does not answer an unmount
// after the linger (a FUSE mount it cannot take down), the node plugin still
// serves publishes, and the unmount call ends at mounterCallTimeout.
func TestNodeUnmountHoldsNoLock(t *testing.T) {
	defer func(d time.Duration) { mounterCallTimeout = d }(mounterCallTimeout)
	mounterCallTimeout = time.Second

	dir, err := os.MkdirTemp("", "bdnvol-lock-") // short: a unix socket path
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "m.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	called, ended, release := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/mounts", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("[]")) })
	mux.HandleFunc("POST /v1/unmount", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // then the server sees the client hang up
		called <- struct{}{}
		select { // the mounter's wedged unmount: it never answers
		case <-r.Context().Done():
			ended <- struct{}{}
		case <-release:
		}
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	defer srv.Close()

	n, err := NewNode(context.Background(), NodeOptions{NodeID: "n1", StateDir: t.TempDir(),
		Mounter: NewMounterClient(sock), Linger: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.lingerLocked("sha256:0000000000000000000000000000000000000000000000000000000000000000")
	n.mu.Unlock()
	select {
	case <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("the linger did not ask the mounter to unmount")
	}

	// A publish (of a registry that refuses connections) takes the lock
	// on its way: it must not wait for the unmount.
	published := make(chan error, 1)
	go func() {
		_, err := n.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
			VolumeId: "v", TargetPath: filepath.Join(t.TempDir(), "target"),
			VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
			VolumeContext:    map[string]string{AttrRef: "127.0.0.1:1/x/y:v1"},
		})
		published <- err
	}()
	select {
	case err := <-published:
		if err == nil {
			t.Error("publish of an unreachable registry succeeded")
		}
	case <-time.After(mounterCallTimeout / 2):
		t.Error("a publish waited for the mounter's unmount: the node plugin holds its lock across the call")
	}
	select {
	case <-ended:
	case <-time.After(10 * mounterCallTimeout):
		t.Error("the unmount call to the mounter was not bounded")
	}
}
