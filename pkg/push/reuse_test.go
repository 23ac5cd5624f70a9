package push

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// memoParams cut the test trees into many packs and pieces.
var memoParams = layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10, Pack: 4 << 10}

// memoTree writes a dataset-shaped tree: n small files in 20 directories,
// two large files, an empty file and a symlink.
func memoTree(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%20), fmt.Sprintf("f%05d.bin", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 100+r.IntN(200))
		for k := range b {
			b[k] = byte(r.Uint32())
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"d03/big.bin", "d17/big.bin"} {
		b := make([]byte, 200<<10)
		for k := range b {
			b[k] = byte(r.Uint32())
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "d05/empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f00005.bin", filepath.Join(dir, "d05/link")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// openTally counts the files a push opens.
type openTally struct {
	Source
	opens atomic.Int64
}

func (o *openTally) Open(ctx context.Context, p string) (ReadAtCloser, error) {
	o.opens.Add(1)
	return o.Source.Open(ctx, p)
}

// pieceLog records the index pieces and chunks pushed into a store.
type pieceLog struct {
	content.Storage
	mu             sync.Mutex
	pieces, chunks []digest.Digest
	exists         atomic.Int64
}

func (l *pieceLog) Push(ctx context.Context, d ocispec.Descriptor, r io.Reader) error {
	l.mu.Lock()
	switch d.MediaType {
	case layout.MediaTypePiece:
		l.pieces = append(l.pieces, d.Digest)
	case layout.MediaTypeChunk:
		l.chunks = append(l.chunks, d.Digest)
	}
	l.mu.Unlock()
	return l.Storage.Push(ctx, d, r)
}

func (l *pieceLog) Exists(ctx context.Context, d ocispec.Descriptor) (bool, error) {
	l.exists.Add(1)
	return l.Storage.Exists(ctx, d)
}

// memoPush pushes dir with a stat cache in cacheDir (files just written
// count as settled) and the piece memo for dest.
func memoPush(t *testing.T, store content.Storage, src Source, dir, cacheDir, dest string) *Result {
	t.Helper()
	cache := statcache.Open(cacheDir, dir, memoParams)
	cache.TrustRecent()
	res, err := Push(context.Background(), store, src, Options{Params: memoParams, Cache: cache, Destination: dest})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// freshPush pushes dir with no cache and no memo into a new store.
func freshPush(t *testing.T, dir string) *Result {
	t.Helper()
	res, err := Push(context.Background(), memory.New(), DirSource(dir), Options{Params: memoParams})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func pieceSet(t *testing.T, store content.Fetcher, root ocispec.Descriptor) map[digest.Digest]bool {
	t.Helper()
	v, err := layout.Open(context.Background(), store, root)
	if err != nil {
		t.Fatal(err)
	}
	out := map[digest.Digest]bool{}
	for _, p := range v.Index.Pieces() {
		out[p.Digest] = true
	}
	return out
}

func rewrite(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRePushReusesUnchangedPieces(t *testing.T) {
	dir, cacheDir := memoTree(t, 6000), t.TempDir()
	log := &pieceLog{Storage: memory.New()}
	first := memoPush(t, log, DirSource(dir), dir, cacheDir, "repo")
	v1 := pieceSet(t, log, first.Root)
	if len(v1) < 8 || first.PiecesReused != 0 {
		t.Fatalf("first push: %d pieces, %d reused; want many, none reused", len(v1), first.PiecesReused)
	}

	// One small file changed, same size.
	changed := filepath.Join(dir, "d07", "f03007.bin")
	old, err := os.ReadFile(changed)
	if err != nil {
		t.Fatal(err)
	}
	rewrite(t, changed, []byte(strings.Repeat("x", len(old))))
	log.mu.Lock()
	log.pieces, log.chunks = nil, nil
	log.mu.Unlock()
	log.exists.Store(0)
	src := &openTally{Source: DirSource(dir)}
	second := memoPush(t, log, src, dir, cacheDir, "repo")
	if want := freshPush(t, dir).Root.Digest; second.Root.Digest != want {
		t.Fatalf("re-push sealed %s, a push reading every file %s", second.Root.Digest, want)
	}
	v2 := pieceSet(t, log, second.Root)
	var changedPieces []digest.Digest
	for d := range v2 {
		if !v1[d] {
			changedPieces = append(changedPieces, d)
		}
	}
	if len(changedPieces) == 0 || len(changedPieces) > 2 {
		t.Fatalf("%d of %d pieces changed; want 1 or 2 (the pack of the file may straddle two)", len(changedPieces), len(v2))
	}
	t.Logf("one file changed: %d of %d pieces built, %d stored, %d chunks stored, %d existence checks, %d files opened",
		second.PiecesBuilt, len(v2), len(log.pieces), len(log.chunks), log.exists.Load(), src.opens.Load())
	if second.PiecesBuilt != len(changedPieces) || second.PiecesReused != len(v2)-len(changedPieces) {
		t.Errorf("built %d pieces, reused %d; want %d built, %d reused", second.PiecesBuilt, second.PiecesReused, len(changedPieces), len(v2)-len(changedPieces))
	}
	if len(log.pieces) != len(changedPieces) {
		t.Errorf("stored %d pieces %v; want only the changed %v", len(log.pieces), log.pieces, changedPieces)
	}
	if len(log.chunks) != 1 {
		t.Errorf("stored %d chunks; want 1 (the changed file's pack)", len(log.chunks))
	}
	// The destination is asked for the new chunk, the metadata and the
	// memo's root, not for the chunks of the version before.
	if n := log.exists.Load(); n > int64(8+len(changedPieces)) {
		t.Errorf("%d existence checks; want the new blobs and manifests only", n)
	}
	// Read: the changed file, and the small files of its new pack for
	// the upload (the stat records know their digests, not their bytes).
	if n := src.opens.Load(); n > 64 {
		t.Errorf("opened %d files; want the changed one and its pack's", n)
	}
	v, err := layout.Open(context.Background(), log, second.Root)
	if err != nil {
		t.Fatal(err)
	}
	i, ok := v.Index.Find("d07/f03007.bin")
	if f := v.Index.File(i); !ok || f.Digest != digest.FromString(strings.Repeat("x", len(old))) {
		t.Fatalf("changed file in the index: %+v", f)
	}

	// Files added and removed move piece cuts: the version is still the
	// one a push reading every file seals.
	if err := os.Remove(filepath.Join(dir, "d11", "f00011.bin")); err != nil {
		t.Fatal(err)
	}
	for k := range 300 {
		rewrite(t, filepath.Join(dir, "d12", fmt.Sprintf("new%04d", k)), []byte(fmt.Sprintf("new file %d", k)))
	}
	rewrite(t, filepath.Join(dir, "d03/big.bin"), make([]byte, 150<<10))
	third := memoPush(t, log, DirSource(dir), dir, cacheDir, "repo")
	if want := freshPush(t, dir).Root.Digest; third.Root.Digest != want {
		t.Fatalf("re-push after adds and removes sealed %s, a push reading every file %s", third.Root.Digest, want)
	}
	t.Logf("adds and removes: %d pieces built, %d reused", third.PiecesBuilt, third.PiecesReused)
	if third.PiecesReused == 0 || third.PiecesBuilt == 0 {
		t.Errorf("built %d, reused %d pieces; want both", third.PiecesBuilt, third.PiecesReused)
	}

	// Unchanged: the version exists, nothing is stored.
	again := memoPush(t, log, DirSource(dir), dir, cacheDir, "repo")
	if again.Root.Digest != third.Root.Digest || !again.Existed || again.PiecesBuilt != 0 {
		t.Errorf("unchanged re-push: %s existed=%v built=%d; want %s, existed, none built", again.Root.Digest, again.Existed, again.PiecesBuilt, third.Root.Digest)
	}
}

func TestPieceMemoStaleOrTorn(t *testing.T) {
	dir, cacheDir := memoTree(t, 3000), t.TempDir()
	store := memory.New()
	first := memoPush(t, store, DirSource(dir), dir, cacheDir, "repo")
	cache := statcache.Open(cacheDir, dir, memoParams)
	memo := cache.MemoPath()
	good, err := os.ReadFile(memo)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.LoadMemo(); err != nil {
		t.Fatalf("memo as written: %v", err)
	}
	n := 0
	change := func() {
		n++
		rewrite(t, filepath.Join(dir, "d02", "f00002.bin"), []byte(fmt.Sprintf("changed %d", n)))
	}

	for name, damage := range map[string]func([]byte) []byte{
		"torn":      func(b []byte) []byte { return b[:len(b)-10] },
		"truncated": func(b []byte) []byte { return b[:len(b)/2] },
		"flipped":   func(b []byte) []byte { b = append([]byte(nil), b...); b[len(b)/2] ^= 1; return b },
		"empty":     func([]byte) []byte { return nil },
		"format": func(b []byte) []byte {
			b = append([]byte(nil), b...)
			b[len("BDNVMEM\x00")] = 9 // the format, after the magic
			return b
		},
	} {
		t.Run(name, func(t *testing.T) {
			rewrite(t, memo, damage(good))
			if m, err := cache.LoadMemo(); err == nil && m != nil {
				t.Fatal("damaged memo decoded")
			}
			change()
			res := memoPush(t, store, DirSource(dir), dir, cacheDir, "repo")
			if res.PiecesReused != 0 {
				t.Errorf("reused %d pieces of a %s memo", res.PiecesReused, name)
			}
			if want := freshPush(t, dir).Root.Digest; res.Root.Digest != want {
				t.Fatalf("sealed %s, want %s", res.Root.Digest, want)
			}
			// Written anew: the next push reuses it.
			if m, err := cache.LoadMemo(); err != nil || m == nil {
				t.Fatalf("memo rewritten: %v", err)
			}
			change()
			if res := memoPush(t, store, DirSource(dir), dir, cacheDir, "repo"); res.PiecesReused == 0 {
				t.Error("the rewritten memo was not used")
			}
			good, _ = os.ReadFile(memo)
		})
	}

	t.Run("other destination", func(t *testing.T) {
		change()
		res := memoPush(t, store, DirSource(dir), dir, cacheDir, "another/repo")
		if res.PiecesReused != 0 {
			t.Errorf("reused %d pieces of a memo of another repository", res.PiecesReused)
		}
	})
	t.Run("version not stored", func(t *testing.T) {
		// The same name, a store that never held the version: every
		// chunk is uploaded.
		other := &pieceLog{Storage: memory.New()}
		res := memoPush(t, other, DirSource(dir), dir, cacheDir, "another/repo")
		if res.PiecesReused != 0 || res.Existed {
			t.Errorf("reused %d pieces of a version the store lacks", res.PiecesReused)
		}
		if len(other.chunks) != res.Chunks {
			t.Errorf("uploaded %d of %d chunks", len(other.chunks), res.Chunks)
		}
		if _, err := layout.Open(context.Background(), other, res.Root); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("other chunking", func(t *testing.T) {
		change()
		p := memoParams
		p.Pack = 8 << 10
		cache := statcache.Open(cacheDir, dir, p)
		cache.TrustRecent()
		// A memo of these parameters is not there; copy the one of the
		// others over to make sure the parameters are checked.
		b, _ := os.ReadFile(memo)
		rewrite(t, cache.MemoPath(), b)
		res, err := Push(context.Background(), store, DirSource(dir), Options{Params: p, Cache: cache, Destination: "another/repo"})
		if err != nil {
			t.Fatal(err)
		}
		if res.PiecesReused != 0 {
			t.Errorf("reused %d pieces cut with other parameters", res.PiecesReused)
		}
	})
	_ = first
}
