package mounts

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// profileFixture is a version in an OCI layout and a volume reading it
// through a counting fetcher and a fresh cache.
type profileFixture struct {
	tgt   oci.Target
	vol   *lazy.Volume
	count *testutil.CountingFetcher
}

func newProfileFixture(t *testing.T, rec *profile.Recorder) *profileFixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	testutil.WriteTree(t, filepath.Join(dir, "tree"), map[string][]byte{
		"a.bin": testutil.RandBytes(3, 300<<10), "b.bin": testutil.RandBytes(4, 100<<10),
	})
	ref, err := oci.ParseRef("oci:" + filepath.Join(dir, "layout") + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := push.Push(ctx, tgt, push.DirSource(filepath.Join(dir, "tree")), push.Options{Params: layout.Params{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := chunkcache.Open(filepath.Join(dir, "cache"), 0)
	if err != nil {
		t.Fatal(err)
	}
	count := &testutil.CountingFetcher{Fetcher: tgt}
	opt := lazy.Options{Cache: cache, Jobs: 2}
	if rec != nil {
		opt.OnRead = rec.Read
	}
	vol, err := lazy.Open(ctx, count, res.Root, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	return &profileFixture{tgt: tgt, vol: vol, count: count}
}

func (fx *profileFixture) chunkDigests(ks ...int) []digest.Digest {
	var out []digest.Digest
	for _, k := range ks {
		out = append(out, fx.vol.Version().Index.ChunkDigest(k))
	}
	return out
}

func TestReplayOfAnotherVersionFetchesNothing(t *testing.T) {
	fx := newProfileFixture(t, nil)
	before := fx.count.Total()
	p := profile.New(digest.FromString("another version"), fx.chunkDigests(0, 1, 2))
	if n, err := profile.Replay(context.Background(), fx.vol, p); !errors.Is(err, profile.ErrOtherVersion) || n != 0 {
		t.Fatalf("Replay = %d, %v; want 0 and ErrOtherVersion", n, err)
	}
	if got := fx.count.Total() - before; got != 0 {
		t.Fatalf("a profile of another version fetched %d blobs", got)
	}
	p = profile.New(fx.vol.Root().Digest, append(fx.chunkDigests(3, 1), digest.FromString("not a chunk")))
	if n, err := profile.Replay(context.Background(), fx.vol, p); err != nil || n != 2 {
		t.Fatalf("Replay = %d, %v; want the 2 chunks of the version", n, err)
	}
	for _, d := range fx.chunkDigests(3, 1) {
		if fx.count.Count(d) != 1 {
			t.Errorf("chunk %s fetched %d times, want 1", d, fx.count.Count(d))
		}
	}
	if got := fx.count.Total() - before; got != 2 {
		t.Fatalf("replay fetched %d blobs, want 2", got)
	}
}

func TestFindProfileNodeFirstThenReferrer(t *testing.T) {
	fx := newProfileFixture(t, nil)
	ctx := context.Background()
	root := fx.vol.Root()
	store := profile.Store{Dir: t.TempDir()}
	opt := profile.Options{Mode: profile.ModeAuto, Store: store}
	if _, _, err := profile.Find(ctx, fx.tgt, root, opt); !errors.Is(err, profile.ErrNotFound) {
		t.Fatalf("with none: %v, want ErrNotFound", err)
	}
	shared := profile.New(root.Digest, fx.chunkDigests(2))
	if _, err := profile.Push(ctx, fx.tgt, root, shared); err != nil {
		t.Fatal(err)
	}
	p, from, err := profile.Find(ctx, fx.tgt, root, opt)
	if err != nil || from != "referrer" || p.Chunks[0] != shared.Chunks[0] {
		t.Fatalf("profile.Find = %v from %q, %v; want the referrer", p, from, err)
	}
	local := profile.New(root.Digest, fx.chunkDigests(1, 0))
	if err := store.Save(local); err != nil {
		t.Fatal(err)
	}
	if p, from, err = profile.Find(ctx, fx.tgt, root, opt); err != nil || from != store.Path(root.Digest) || len(p.Chunks) != 2 {
		t.Fatalf("profile.Find = %v from %q, %v; want the node's", p, from, err)
	}
	for _, mode := range []string{profile.ModeOff, ""} {
		if _, _, err := profile.Find(ctx, fx.tgt, root, profile.Options{Mode: mode, Store: store}); !errors.Is(err, profile.ErrNotFound) {
			t.Fatalf("mode %q: %v, want ErrNotFound", mode, err)
		}
	}
	file := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(file, shared.Encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, from, err = profile.Find(ctx, nil, root, profile.Options{Mode: file}); err != nil || from != file || len(p.Chunks) != 1 {
		t.Fatalf("mode FILE: %v from %q, %v", p, from, err)
	}
	if err := profile.CheckMode(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing profile file was accepted")
	}
}

func TestAutoModeRecordsWhenReadsPause(t *testing.T) {
	rec := profile.NewRecorder(profile.Window{Quiet: 100 * time.Millisecond})
	fx := newProfileFixture(t, rec)
	store := profile.Store{Dir: t.TempDir()}
	profile.Start(fx.vol, fx.tgt, rec, profile.Options{Mode: profile.ModeAuto, Store: store})
	f, err := fx.vol.Open("b.bin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(make([]byte, 10), 0); err != nil {
		t.Fatal(err)
	}
	root := fx.vol.Root().Digest
	deadline := time.Now().Add(20 * time.Second)
	var p *profile.Profile
	for p == nil && time.Now().Before(deadline) {
		p, _ = store.Load(root)
		time.Sleep(20 * time.Millisecond)
	}
	if p == nil {
		t.Fatal("no profile recorded once reads paused")
	}
	x := fx.vol.Version().Index
	i, _ := x.Find("b.bin")
	if want := x.ChunkDigest(x.File(i).Extents[0].Chunk); len(p.Chunks) != 1 || p.Chunks[0] != want {
		t.Fatalf("recorded %v, want [%s]", p.Chunks, want)
	}
}
