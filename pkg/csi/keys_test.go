package csi

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fakeMounter answers the mounter API with mounts and records unmount
// requests; mounts without a Key are what an older mounter reports.
type fakeMounter struct {
	mu       sync.Mutex
	mounts   []MountInfo
	unmounts []unmountRequest
}

func (f *fakeMounter) serve(t *testing.T) *MounterClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "m.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/mounts", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		json.NewEncoder(w).Encode(f.mounts)
	})
	mux.HandleFunc("POST /v1/unmount", func(w http.ResponseWriter, r *http.Request) {
		var req unmountRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.unmounts = append(f.unmounts, req)
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return NewMounterClient(sock)
}

func (f *fakeMounter) got() []unmountRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]unmountRequest(nil), f.unmounts...)
}

// TestLingerPerMountKey: one digest used from two repositories. With a
// mounter that keys mounts, the linger of one repository's key unmounts
// that mount alone, by key. With an older mounter (one mount per digest,
// no keys) it is left while the other repository's pods use the digest,
// and unmounted by digest after the last of them.
func TestLingerPerMountKey(t *testing.T) {
	const d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	a, b := "reg.example/tenant-a/vol@"+d, "reg.example/other/copy@"+d
	for _, keyed := range []bool{true, false} {
		f := &fakeMounter{}
		if keyed {
			f.mounts = []MountInfo{{Digest: d, Ref: a, Key: a}, {Digest: d, Ref: b, Key: b}}
		} else {
			f.mounts = []MountInfo{{Digest: d, Ref: a}}
		}
		client := f.serve(t)
		n, err := NewNode(context.Background(), NodeOptions{NodeID: "n", StateDir: t.TempDir(), Mounter: client, Linger: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		// Both mounts start their linger (no target); let those pass.
		time.Sleep(100 * time.Millisecond)
		f.mu.Lock()
		f.unmounts = nil
		f.mu.Unlock()
		if err := n.ts.write(target{Path: "/pods/b/mount", Pinned: b, Digest: d}); err != nil {
			t.Fatal(err)
		}
		n.mu.Lock()
		n.releaseLocked(a) // the last pod of repository a went
		n.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		got := f.got()
		if keyed && (len(got) != 1 || got[0].Ref != a || got[0].Digest != d) {
			t.Errorf("keyed mounter: unmounts %+v, want the one of %s", got, a)
		}
		if !keyed && len(got) != 0 {
			t.Errorf("older mounter: unmounts %+v while a pod of %s uses the digest's one mount", got, b)
		}
		n.ts.remove("/pods/b/mount")
		n.mu.Lock()
		n.releaseLocked(b)
		n.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		got = f.got()
		if len(got) == 0 || got[len(got)-1].Digest != d || got[len(got)-1].Ref != b {
			t.Errorf("keyed=%v: after the last pod of %s: unmounts %+v", keyed, b, got)
		}
	}
}
