package push

import (
	"context"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// statedSource is a directory whose walk states each file's SHA-256, as
// the Hugging Face Hub does for LFS files, and that counts the files opened.
type statedSource struct {
	Source
	files map[string][]byte
	mu    sync.Mutex
	opens map[string]int
}

func (s *statedSource) Walk(ctx context.Context) ([]Entry, error) {
	es, err := s.Source.Walk(ctx)
	for i, e := range es {
		if b, ok := s.files[e.Path]; ok {
			es[i].Digest = digest.FromBytes(b)
		}
	}
	return es, err
}

func (s *statedSource) Open(ctx context.Context, p string) (ReadAtCloser, error) {
	s.mu.Lock()
	s.opens[p]++
	s.mu.Unlock()
	return s.Source.Open(ctx, p)
}

// With the previous version, a large file whose stated digest it holds is
// not opened and the version is the same, nor is a small file whose pack
// the previous version holds as it is; a changed large file is read.
func TestPushReusesPreviousByStatedDigest(t *testing.T) {
	ctx := context.Background()
	p := layout.Params{Min: 16 << 10, Avg: 64 << 10, Max: 256 << 10, Pack: 16 << 10}
	files := map[string][]byte{
		"a.bin": testutil.RandBytes(1, 500<<10),
		"b.bin": testutil.RandBytes(2, 300<<10),
		"s.txt": testutil.RandBytes(3, 900),
	}
	dir := t.TempDir()
	testutil.WriteVolumeTree(t, dir, files)
	store := memory.New()
	push := func(prev *layout.Index) (*Result, map[string]int) {
		src := &statedSource{Source: DirSource(dir), files: files, opens: map[string]int{}}
		res, err := Push(ctx, store, src, Options{Params: p, Previous: prev})
		if err != nil {
			t.Fatal(err)
		}
		return res, src.opens
	}
	v1, opens := push(nil)
	if opens["a.bin"] == 0 || opens["b.bin"] == 0 {
		t.Fatalf("premise: a push without a previous version reads every file: %v", opens)
	}
	v2, opens := push(v1.Index)
	if len(opens) != 0 || v2.Root.Digest != v1.Root.Digest {
		t.Errorf("push over an unchanged previous version opened %v and sealed %s (want no file opened, and %s)", opens, v2.Root.Digest, v1.Root.Digest)
	}
	files["b.bin"] = testutil.RandBytes(4, 300<<10)
	testutil.WriteVolumeTree(t, dir, files)
	v3, opens := push(v1.Index)
	if opens["a.bin"]+opens["s.txt"] != 0 || opens["b.bin"] == 0 {
		t.Errorf("push with b.bin changed opened %v; want b.bin only", opens)
	}
	checkDigests(t, v3.Index, files)
	files["s.txt"] = testutil.RandBytes(5, 700)
	testutil.WriteVolumeTree(t, dir, files)
	v4, opens := push(v3.Index)
	if opens["s.txt"] == 0 || opens["a.bin"]+opens["b.bin"] != 0 {
		t.Errorf("push with s.txt changed opened %v; want s.txt only (its pack is new)", opens)
	}
	checkDigests(t, v4.Index, files)
}

// checkDigests fails t for each file of x whose digest is not that of its
// bytes in files.
func checkDigests(t *testing.T, x *layout.Index, files map[string][]byte) {
	t.Helper()
	for i := range x.Len() {
		if f := x.File(i); f.Type == layout.TypeFile && f.Digest != digest.FromBytes(files[f.Path]) {
			t.Errorf("%s: digest %s in the new version, not its bytes'", f.Path, f.Digest)
		}
	}
}
