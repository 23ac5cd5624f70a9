package chunkcache

import (
	"bytes"
	"context"
	"io"
	"testing"

	"oras.land/oras-go/v2/content"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"
)

func TestCacheReadOnly(t *testing.T) {
	ctx := context.Background()
	store := memory.New()
	var descs []ocispec.Descriptor
	blobs := map[digest.Digest][]byte{}
	for i := range 2 {
		b := randBytes(uint64(i+7), 5000)
		d := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(b), Size: int64(len(b))}
		if err := store.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		descs, blobs[d.Digest] = append(descs, d), b
	}
	src := &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}
	c, err := Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	read := func(f content.Fetcher, d ocispec.Descriptor) {
		t.Helper()
		rc, err := f.Fetch(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(b, blobs[d.Digest]) {
			t.Fatalf("%s: wrong bytes (%v)", d.Digest, err)
		}
	}
	read(c.Fetcher(src), descs[0]) // cached
	src.reset()
	ro := c.ReadOnly(src)
	read(ro, descs[0])
	read(ro, descs[1])
	if n, _ := src.total(); n != 1 || src.fetches[descs[1].Digest] != 1 {
		t.Errorf("source fetches %v; want only the blob not in the cache", src.fetches)
	}
	if c.Contains(descs[1].Digest) {
		t.Error("ReadOnly stored a blob in the cache")
	}
}
