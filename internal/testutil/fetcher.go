package testutil

import (
	"context"
	"io"
	"maps"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// CountingFetcher is a content.Fetcher that counts the fetches of each
// digest. It is safe for concurrent use.
type CountingFetcher struct {
	content.Fetcher
	mu sync.Mutex
	n  map[digest.Digest]int
}

// Fetch counts the fetch of desc and fetches it from the wrapped fetcher.
func (c *CountingFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[digest.Digest]int{}
	}
	c.n[desc.Digest]++
	c.mu.Unlock()
	return c.Fetcher.Fetch(ctx, desc)
}

// Count returns how many times d was fetched.
func (c *CountingFetcher) Count(d digest.Digest) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[d]
}

// Counts returns a copy of the fetches by digest.
func (c *CountingFetcher) Counts() map[digest.Digest]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// Total returns the number of fetches of all digests.
func (c *CountingFetcher) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}
