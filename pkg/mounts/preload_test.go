package mounts

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
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

// TestPreloadHandsOffProfile: with the profile lookup Preload did handed
// to it (Target.Profile, as `mount --daemon` hands it to its daemon), a
// mount asks the registry nothing to find its profile: after the roots, its
// first requests are the replay's chunks. A failed lookup handed off is
// reported as the mount reports its own, and the mount mounts without a
// profile; a lookup for another version is not used (the mount looks
// itself).
func TestPreloadHandsOffProfile(t *testing.T) {
	ref, rl := pushedVersion(t)
	ctx := context.Background()
	tg, err := oci.Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	parent, err := chunkcache.Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The profile lists the version's chunks, last first.
	loaded := Preload(ctx, []Target{{Ref: ref, Mountpoint: "/m"}}, parent, OpenOptions{})
	if len(loaded) != 1 {
		t.Fatalf("Preload returned %+v", loaded)
	}
	root := loaded[0].Root
	pc, err := chunkcache.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	probe, _, err := Open(ctx, ref, OpenOptions{Cache: pc})
	if err != nil {
		t.Fatal(err)
	}
	x := probe.Version().Index
	n := x.NumChunks()
	probe.Close()
	var chunks []digest.Digest
	for k := n - 1; k >= 0; k-- {
		chunks = append(chunks, x.ChunkDigest(k))
	}
	p := profile.New(root.Digest, chunks)
	md, err := profile.Push(ctx, tg, root, p)
	if err != nil {
		t.Fatal(err)
	}
	auto := profile.Options{Mode: profile.ModeAuto}
	loaded = Preload(ctx, []Target{{Ref: ref, Mountpoint: "/m"}}, parent, OpenOptions{Profile: auto})
	if len(loaded) != 1 || loaded[0].Profile == nil {
		t.Fatalf("Preload in auto mode returned %+v; want the target with its profile lookup", loaded)
	}
	if _, ok := loaded[0].Profile(ctx); !ok {
		t.Fatal("Preload's profile lookup handed off nothing")
	}
	rl.take()

	// mount opens a fresh cache in dir (the daemon's) with what was handed
	// off, and returns its log once the profile was replayed or not used.
	mount := func(handed func(context.Context) (profile.Lookup, bool)) []string {
		t.Helper()
		daemon, err := chunkcache.Open(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var logs []string
		done := make(chan struct{}, 1)
		opt := auto
		opt.Handed = handed
		opt.Logf = func(format string, args ...any) {
			mu.Lock()
			logs = append(logs, fmt.Sprintf(format, args...))
			mu.Unlock()
			done <- struct{}{}
		}
		vol, _, err := Open(ctx, ref, OpenOptions{Cache: daemon, Known: root, Profile: opt})
		if err != nil {
			t.Fatal(err)
		}
		<-done
		vol.Close()
		mu.Lock()
		defer mu.Unlock()
		return logs
	}

	logs := mount(loaded[0].Profile)
	if len(logs) != 1 || !strings.Contains(logs[0], fmt.Sprintf("from referrer: %d chunks fetched", n)) {
		t.Errorf("the mount logged %q; want the referrer's %d chunks replayed", logs, n)
	}
	var want []string
	for _, d := range p.Chunks {
		want = append(want, "GET /v2/"+ref.Repository+"/blobs/"+d.String())
	}
	got := rl.take()
	slices.Sort(want)
	slices.Sort(got)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the mount with the handed-off lookup asked %q; want the profile's chunks alone, %q", got, want)
	}

	// A failed lookup: reported as the mount's own; nothing replayed.
	logs = mount(func(context.Context) (profile.Lookup, bool) {
		return profile.Lookup{Version: root.Digest, Err: "referrers of x: 500 boom"}, true
	})
	if want := fmt.Sprintf("profile of %s not used: referrers of x: 500 boom", root.Digest); len(logs) != 1 || logs[0] != want {
		t.Errorf("the mount logged %q; want %q", logs, want)
	}
	if got := rl.take(); len(got) != 0 {
		t.Errorf("the mount with a failed handed-off lookup asked %q; want nothing", got)
	}

	// A lookup for another version: the mount looks for its own.
	logs = mount(func(context.Context) (profile.Lookup, bool) {
		return profile.Lookup{Version: digest.FromString("another version"), Doc: profile.New(digest.FromString("another version"), nil).Encode()}, true
	})
	if len(logs) != 1 || !strings.Contains(logs[0], "from referrer:") {
		t.Errorf("the mount logged %q; want its own referrer replayed", logs)
	}
	asked := false
	for _, r := range rl.take() {
		if strings.Contains(r, md.Digest.String()) {
			asked = true
		}
	}
	if !asked {
		t.Error("the mount given another version's lookup did not fetch its own profile's manifest")
	}
}
