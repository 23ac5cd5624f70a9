package chunkcache

import (
	"bytes"
	"context"
	"errors"
	"hash"
	"io"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// countHashing makes the cache's fetch hash count into the returned
// counter for the rest of the test.
func countHashing(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	old, oldFetch := newHash, newFetchHash
	newHash = func() hash.Hash { return testutil.NewCountingHash(&n) }
	newFetchHash = newHash
	t.Cleanup(func() { newHash, newFetchHash = old, oldFetch })
	return &n
}

// checkedFetcher answers with the body as bytes verified against vouch
// (a decoder's verify.Checked), wrapped as a lazy mount's counting body
// wraps it.
type checkedFetcher struct {
	body  []byte
	vouch ocispec.Descriptor
}

type wrappedBody struct{ io.ReadCloser }

func (w wrappedBody) Checked() *verify.Checked { return verify.CheckedOf(w.ReadCloser) }

func (f checkedFetcher) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return wrappedBody{verify.NewChecked(bytes.Clone(f.body), f.vouch, nil)}, nil
}

// TestLoadTakesCheckedBytes: a chunk a decoder verified (a delta chunk,
// served as a verify.Checked) is stored and served without the cache
// hashing it again, to disk or, when the disk is full, to memory; bytes
// vouched for as another blob's are hashed and refused.
func TestLoadTakesCheckedBytes(t *testing.T) {
	ctx := context.Background()
	data := randBytes(11, 300_000)
	desc := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(data), Size: int64(len(data))}
	hashed := countHashing(t)
	c, err := Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := c.Load(ctx, checkedFetcher{data, desc}, desc)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(io.NewSectionReader(ch, 0, desc.Size))
	ch.Close()
	if !bytes.Equal(got, data) || !c.Contains(desc.Digest) {
		t.Fatalf("served the right bytes %v, stored %v", bytes.Equal(got, data), c.Contains(desc.Digest))
	}
	if n := hashed.Load(); n != 0 {
		t.Errorf("the cache hashed %d bytes of a chunk already verified", n)
	}
	if b, err := c.fetchToMemory(ctx, checkedFetcher{data, desc}, desc); err != nil || !bytes.Equal(b, data) || hashed.Load() != 0 {
		t.Errorf("into memory: %v, equal %v, hashed %d", err, bytes.Equal(b, data), hashed.Load())
	}
	// Vouched for as another blob: hashed, and refused.
	other := bytes.Clone(data)
	other[7] ^= 1
	odesc := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(other), Size: desc.Size}
	c2, err := Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Load(ctx, checkedFetcher{other, odesc}, desc); !errors.Is(err, verify.ErrDigestMismatch) || hashed.Load() != desc.Size {
		t.Errorf("bytes vouched for as another blob: %v, hashed %d", err, hashed.Load())
	}
}
