package pull

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
)

// extentsBound is how long a pull of a file of many extents may take: a
// bound on the work (one pass over the extents), far above what it needs.
const extentsBound = 60 * time.Second

// splitFile is a file of n extents of chunk k (of size bytes), in order,
// so that the file's bytes are the chunk's.
func splitFile(p string, data []byte, k, n int) layout.File {
	f := layout.File{Path: p, Type: layout.TypeFile, Mode: 0o644, Digest: digest.FromBytes(data), Size: int64(len(data))}
	step := int64(len(data) / n)
	for off := int64(0); off < int64(len(data)); off += step {
		f.Extents = append(f.Extents, layout.Extent{Chunk: k, Offset: off, Length: min(step, int64(len(data))-off)})
	}
	return f
}

// pullBounded runs fn, failing the test if it has not returned within
// extentsBound.
func pullBounded(t *testing.T, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(extentsBound):
		t.Fatalf("%s did not finish in %v", what, extentsBound)
		return nil
	}
}

// TestPullManyExtents: a file of 500,000 extents pulls with work linear in
// its extents, both from a chunk fetched whole (packed, under
// DefaultParams.Max) and from one streamed (over it).
func TestPullManyExtents(t *testing.T) {
	const n = 500_000
	packedData := testutil.RandBytes(41, n)      // 1-byte extents
	streamedData := testutil.RandBytes(42, 36*n) // 36-byte extents, over 16 MiB
	if int64(len(streamedData)) <= layout.DefaultParams.Max {
		t.Fatal("the streamed chunk must be larger than a packed one")
	}
	store := memory.New()
	v := sealFiles(t, store, []layout.File{
		splitFile("packed", packedData, 0, n),
		splitFile("streamed", streamedData, 1, n),
	}, packedData, streamedData)
	dst := t.TempDir()
	var res *Result
	err := pullBounded(t, "a pull of two files of 500,000 extents", func() (err error) {
		res, err = Materialise(context.Background(), store, v, dst, Options{Jobs: 2})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ChunksFetched != 2 {
		t.Errorf("fetched %d chunks, want 2", res.ChunksFetched)
	}
	for name, want := range map[string][]byte{"packed": packedData, "streamed": streamedData} {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: wrong bytes", name)
		}
	}
}

// cancelOnFetch cancels a context when a chunk is first fetched, then
// serves it whole.
type cancelOnFetch struct {
	content.Fetcher
	cancel context.CancelFunc
	once   sync.Once
}

func (c *cancelOnFetch) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := c.Fetcher.Fetch(ctx, d)
	c.once.Do(c.cancel)
	return rc, err
}

// TestPullCancelledManyExtents: a pull of a file of 1,000,000 extents
// whose context is cancelled as its chunk arrives returns context.Canceled
// and stops writing: the file never reaches its final name.
func TestPullCancelledManyExtents(t *testing.T) {
	const n = 1_000_000
	data := testutil.RandBytes(43, n)
	store := memory.New()
	v := sealFiles(t, store, []layout.File{splitFile("f", data, 0, n), {Path: "g", Type: layout.TypeFile, Mode: 0o644, Digest: digest.FromBytes(data), Size: int64(len(data)), Extents: []layout.Extent{{Chunk: 0, Length: int64(len(data))}}}}, data)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dst := t.TempDir()
	err := pullBounded(t, "a cancelled pull of a file of 1,000,000 extents", func() error {
		_, err := Materialise(ctx, &cancelOnFetch{Fetcher: store, cancel: cancel}, v, dst, Options{Jobs: 1})
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want %v", err, context.Canceled)
	}
	if _, err := os.Lstat(filepath.Join(dst, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("f is at its final name after the cancel (%v): the pull went on writing", err)
	}
}
