package chunkcache

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"
)

// fakeFetcher serves blobs from a memory store, counting fetches; it can
// flip a byte of the blobs marked corrupt.
type fakeFetcher struct {
	src *memory.Store

	mu      sync.Mutex
	fetches map[digest.Digest]int
	corrupt map[digest.Digest]bool
}

func (f *fakeFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	f.mu.Lock()
	f.fetches[desc.Digest]++
	flip := f.corrupt[desc.Digest]
	f.mu.Unlock()
	rc, err := f.src.Fetch(ctx, desc)
	if err != nil || !flip {
		return rc, err
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, err
	}
	b[len(b)/2] ^= 0xff
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (f *fakeFetcher) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fetches = map[digest.Digest]int{}
}

func (f *fakeFetcher) total() (n int, b int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.fetches {
		n += c
	}
	return n, 0
}

// randBytes returns n pseudo-random bytes from seed.
func randBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}
