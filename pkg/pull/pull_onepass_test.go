package pull

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// corrupting serves one chunk with a flipped byte and counts its fetches.
type corrupting struct {
	content.Fetcher
	target digest.Digest
	local  bool
	n      atomic.Int64
}

func (c *corrupting) Local() bool { return c.local }

func (c *corrupting) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := c.Fetcher.Fetch(ctx, d)
	if err != nil || d.Digest != c.target {
		return rc, err
	}
	c.n.Add(1)
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, err
	}
	b[len(b)/2] ^= 1
	return io.NopCloser(bytes.NewReader(b)), nil
}

// TestPullLocalSourceNotRefetched: a corrupt chunk of a local layout is
// read once (reading a file again does not cure it); from a registry it is
// fetched again, a bounded number of times.
func TestPullLocalSourceNotRefetched(t *testing.T) {
	store, v := pushed(t, layout.Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}, map[string][]byte{"f": testutil.RandBytes(3, 100<<10)})
	for _, local := range []bool{true, false} {
		c := &corrupting{Fetcher: store, target: v.Index.Chunk(0).Digest, local: local}
		_, err := Materialise(context.Background(), c, v, t.TempDir(), Options{Jobs: 1})
		if !errors.Is(err, layout.ErrDigestMismatch) {
			t.Fatalf("local %v: err = %v, want %v", local, err, layout.ErrDigestMismatch)
		}
		want := int64(fetchAttempts)
		if local {
			want = 1
		}
		if got := c.n.Load(); got != want {
			t.Errorf("local %v: corrupt chunk fetched %d times, want %d", local, got, want)
		}
	}
}

// TestPullChecksFileDigestOnlyWhenAsked: pull vouches for bytes by their
// chunk digests and does not read files back; with VerifyFiles it also
// checks each file's SHA-256 and refuses a file that does not match.
func TestPullChecksFileDigestOnlyWhenAsked(t *testing.T) {
	files := map[string][]byte{"a": testutil.RandBytes(4, 200<<10), "b": []byte("b\n")}
	store, v := pushed(t, layout.Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}, files)
	expand(v.Index)
	for i := range v.Index.Files {
		if v.Index.Files[i].Path == "a" {
			v.Index.Files[i].Digest = digest.FromString("not a's bytes")
		}
	}
	dst := t.TempDir()
	if _, err := Materialise(context.Background(), store, v, dst, Options{Jobs: 2}); err != nil {
		t.Fatalf("pull without VerifyFiles: %v", err)
	}
	checkPulled(t, dst, files, nil)
	_, err := Materialise(context.Background(), store, v, t.TempDir(), Options{Jobs: 2, VerifyFiles: true})
	if !errors.Is(err, layout.ErrDigestMismatch) {
		t.Fatalf("pull with VerifyFiles of a file whose digest differs: err = %v, want %v", err, layout.ErrDigestMismatch)
	}
}

// tmpCounting counts, at each fetch, the temporary files in the pull's
// private directory.
type tmpCounting struct {
	content.Fetcher
	dir string
	mu  sync.Mutex
	max int
}

func (c *tmpCounting) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	names, _ := filepath.Glob(filepath.Join(c.dir, pullDirName, "*.part"))
	c.mu.Lock()
	c.max = max(c.max, len(names))
	c.mu.Unlock()
	return c.Fetcher.Fetch(ctx, d)
}

// TestPullTemporariesOnlyInFlight: temporary files exist for the files
// being written, not for every file of the volume up front.
func TestPullTemporariesOnlyInFlight(t *testing.T) {
	files := map[string][]byte{}
	for i := range 120 {
		files[fmt.Sprintf("d%d/f%03d", i%4, i)] = testutil.RandBytes(uint64(100+i), 40<<10)
	}
	store, v := pushed(t, layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}, files)
	dst := t.TempDir()
	c := &tmpCounting{Fetcher: store, dir: dst}
	if _, err := Materialise(context.Background(), c, v, dst, Options{Jobs: 2}); err != nil {
		t.Fatal(err)
	}
	if c.max > 8 {
		t.Errorf("%d temporary files at once for %d files with 2 jobs", c.max, len(files))
	}
	checkPulled(t, dst, files, nil)
	if _, err := os.Stat(filepath.Join(dst, pullDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("private directory left after success: %v", err)
	}
}

// TestPullRefusesKnownWrongDigest: where the index alone shows a file's
// SHA-256 is wrong (an empty file, a file of one whole chunk), pull refuses
// it before writing anything, without reading any file back.
func TestPullRefusesKnownWrongDigest(t *testing.T) {
	for _, name := range []string{"one-chunk", "empty"} {
		files := map[string][]byte{"one-chunk": []byte("one chunk\n"), "empty": {}}
		store, v := pushed(t, layout.Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}, files)
		expand(v.Index)
		for i := range v.Index.Files {
			if v.Index.Files[i].Path == name {
				v.Index.Files[i].Digest = digest.FromString("other")
			}
		}
		dst := t.TempDir()
		_, err := Materialise(context.Background(), store, v, dst, Options{})
		if !errors.Is(err, layout.ErrDigestMismatch) {
			t.Fatalf("%s: err = %v, want %v", name, err, layout.ErrDigestMismatch)
		}
		if _, err := os.Lstat(filepath.Join(dst, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: under its final name after a refused pull (%v)", name, err)
		}
	}
}
