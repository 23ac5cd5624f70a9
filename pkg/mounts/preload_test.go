package mounts

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// requestLog records the requests a test registry answered.
type requestLog struct {
	mu   sync.Mutex
	reqs []string
}

func (l *requestLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.reqs = append(l.reqs, r.Method+" "+r.URL.Path)
		l.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

// take returns the requests recorded since the last take.
func (l *requestLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.reqs
	l.reqs = nil
	return r
}

// pushedVersion starts a registry, pushes a small version to it tagged v1
// and returns its reference and the registry's request log.
func pushedVersion(t *testing.T) (oci.Ref, *requestLog) {
	t.Helper()
	ctx := context.Background()
	rl := &requestLog{}
	srv := httptest.NewServer(rl.wrap(ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)))))
	t.Cleanup(srv.Close)
	ref, err := oci.ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/m:v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	testutil.WriteTree(t, dir, map[string][]byte{"a.txt": []byte("alpha"), "d/b.bin": testutil.RandBytes(1, 70000)})
	res, err := push.Push(ctx, tg, push.DirSource(dir), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.Tag(ctx, res.Root, "v1"); err != nil {
		t.Fatal(err)
	}
	rl.take()
	return ref, rl
}

// TestPreloadLeavesOpenOneRequest: once Preload (the waiting process of
// `mount --daemon`) has run on a cache directory, an Open of the same
// reference by another user of that directory (the daemon: a Cache of its
// own) asks the registry for the manifest alone; the index it reads, in
// pieces that would each be a request, comes verified from the cache.
func TestPreloadLeavesOpenOneRequest(t *testing.T) {
	ref, rl := pushedVersion(t)
	ctx := context.Background()
	dir := t.TempDir()
	parent, err := chunkcache.Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	Preload(ctx, []Target{{Ref: ref}}, parent, OpenOptions{})
	if got := rl.take(); len(got) == 0 {
		t.Fatal("Preload made no request")
	}
	daemon, err := chunkcache.Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	vol, _, err := Open(ctx, ref, OpenOptions{Cache: daemon})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	var blobs []string
	for _, r := range rl.take() {
		if strings.Contains(r, "/blobs/") {
			blobs = append(blobs, r)
		}
	}
	if len(blobs) > 0 {
		t.Errorf("Open after Preload fetched %d blobs from the registry: %v; want the manifest alone", len(blobs), blobs)
	}
	if _, ok := vol.Lookup("d/b.bin"); !ok {
		t.Error("the opened version has no d/b.bin")
	}
}

// TestPreloadChecksPolicy: a target whose signature policy the version
// does not meet loads nothing into the cache.
func TestPreloadChecksPolicy(t *testing.T) {
	ref, rl := pushedVersion(t)
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	v, err := signature.NewVerifier(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	cache, err := chunkcache.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	Preload(context.Background(), []Target{{Ref: ref, Policy: signature.Policy{Keys: []signature.Verifier{v}}}}, cache, OpenOptions{})
	for _, r := range rl.take() {
		if strings.Contains(r, "/blobs/") {
			t.Errorf("Preload of an unsigned version under a policy fetched %s", r)
		}
	}
	if n := cache.Size(); n != 0 {
		t.Errorf("the cache holds %d bytes after Preload of an unsigned version under a policy; want none", n)
	}
}

// TestPreloadHandsOffRoot: with the root Preload resolved handed to it
// (Target.Root, as `mount --daemon` hands it to its daemon), an Open by
// another user of the cache directory asks the registry nothing before
// it is ready; the policy is still checked, and a root that is not in the
// cache, or is not the digest the reference pins, is resolved as ever.
func TestPreloadHandsOffRoot(t *testing.T) {
	ref, rl := pushedVersion(t)
	ctx := context.Background()
	dir := t.TempDir()
	parent, err := chunkcache.Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	loaded := Preload(ctx, []Target{{Ref: ref, Mountpoint: "/m"}}, parent, OpenOptions{})
	if len(loaded) != 1 || loaded[0].Root.Digest == "" || loaded[0].Mountpoint != "/m" {
		t.Fatalf("Preload returned %+v; want the target with its root", loaded)
	}
	root := loaded[0].Root
	rl.take()
	daemon, err := chunkcache.Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	vol, pinned, err := Open(ctx, ref, OpenOptions{Cache: daemon, Known: root})
	if err != nil {
		t.Fatal(err)
	}
	vol.Close()
	if got := rl.take(); len(got) > 0 {
		t.Errorf("Open with the handed-off root asked the registry %v; want nothing", got)
	}
	if want := ref.Pinned(root.Digest); pinned != want {
		t.Errorf("pinned %s, want %s", pinned, want)
	}

	// The policy is checked on the handed-off root too.
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	v, err := signature.NewVerifier(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(ctx, ref, OpenOptions{Cache: daemon, Known: root, Policy: signature.Policy{Keys: []signature.Verifier{v}}}); err == nil {
		t.Error("Open of an unsigned handed-off root under a policy succeeded")
	}

	// Not in this cache: resolved from the registry.
	fresh, err := chunkcache.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	rl.take()
	vol, _, err = Open(ctx, ref, OpenOptions{Cache: fresh, Known: root})
	if err != nil {
		t.Fatal(err)
	}
	vol.Close()
	if got := rl.take(); len(got) == 0 || !strings.Contains(got[0], "/manifests/v1") {
		t.Errorf("Open with a root not in its cache asked %v; want the manifest by tag first", got)
	}

	// A reference pinning another digest ignores the handed-off root.
	other := ref
	other.Tag, other.Digest = "", digest.FromString("another version")
	if _, _, err := Open(ctx, other, OpenOptions{Cache: daemon, Known: root}); err == nil {
		t.Error("Open of a reference pinning a missing digest succeeded with another handed-off root")
	}
}
