package chunkcache

import (
	"context"
	"io"

	"oras.land/oras-go/v2/content"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ReadOnly returns a fetcher that serves the blobs already in c from it
// (verified, as c.Fetcher does) and fetches the others from src without
// storing them. An entry that turns out damaged is fetched again through
// c, which replaces it.
func (c *Cache) ReadOnly(src content.Fetcher) content.Fetcher {
	return cacheReader{cache: c, src: src, filled: c.Fetcher(src)}
}

type cacheReader struct {
	cache  *Cache
	src    content.Fetcher
	filled content.Fetcher
}

func (r cacheReader) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if r.cache.Contains(desc.Digest) {
		return r.filled.Fetch(ctx, desc)
	}
	return r.src.Fetch(ctx, desc)
}

// Local reports whether the source reads local files, so that a bad chunk
// is not fetched again.
func (r cacheReader) Local() bool { return isLocal(r.src) }

// Origin returns the origin of the cache view the fetcher reads through.
func (r cacheReader) Origin() string { return r.cache.origin }
