package chunkcache

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// TestWrongSizeKeepsVerifiedEntry checks that a descriptor naming a cached
// chunk's digest with another size fails that load and keeps the entry, in
// the process that stored it, in a new one, and through Fetcher (as pull
// reads the cache).
func TestWrongSizeKeepsVerifiedEntry(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	data := bytes.Repeat([]byte("verified chunk bytes "), 100)
	desc := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(data), Size: int64(len(data))}
	store := memory.New()
	if err := store.Push(ctx, desc, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	c1, err := Open(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := c1.Load(ctx, store, desc)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	p := c1.path(desc.Digest)
	// Drop the mark so that a new process must hash the entry to trust it.
	_ = unix.Removexattr(p, vouchXattr)

	for _, size := range []int64{desc.Size - 1, desc.Size + 7, 1} {
		wrong := desc
		wrong.Size = size
		for name, c := range map[string]*Cache{"same process": c1, "new process": mustOpenCache(t, dir)} {
			_, err := c.Load(ctx, store, wrong)
			if !errors.Is(err, ErrWrongSize) || !strings.Contains(err.Error(), desc.Digest.String()) {
				t.Fatalf("%s, size %d: err %v, want ErrWrongSize naming %s", name, size, err, desc.Digest)
			}
			rc, err := c.Fetcher(store).Fetch(ctx, wrong)
			if err == nil {
				rc.Close()
			}
			if !errors.Is(err, ErrWrongSize) {
				t.Fatalf("%s, size %d, through Fetcher: err %v, want ErrWrongSize", name, size, err)
			}
			if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, data) {
				t.Fatalf("%s, size %d: the verified entry is gone or changed (%v)", name, size, err)
			}
		}
	}
	// The right descriptor is still served from the cache, not fetched.
	c3 := mustOpenCache(t, dir)
	ch, err = c3.Load(ctx, store, desc)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	if s := c3.Stats(); s.Hits != 1 || s.Fetches != 0 || s.Corrupt != 0 {
		t.Fatalf("stats %+v, want one hit and no fetch", s)
	}
}

// TestWrongSizeDamagedEntryDropped checks that an entry of the wrong size
// whose bytes do not match its name is still treated as damaged: dropped
// and fetched again.
func TestWrongSizeDamagedEntryDropped(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	data := []byte("the real chunk")
	desc := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(data), Size: int64(len(data))}
	store := memory.New()
	if err := store.Push(ctx, desc, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	c := mustOpenCache(t, dir)
	if err := os.WriteFile(c.path(desc.Digest), data[:5], 0o644); err != nil {
		t.Fatal(err)
	}
	ch, err := c.Load(ctx, store, desc)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	if b, _ := os.ReadFile(c.path(desc.Digest)); !bytes.Equal(b, data) {
		t.Fatalf("entry holds %q, want the fetched chunk", b)
	}
	if s := c.Stats(); s.Corrupt != 1 || s.Fetches != 1 {
		t.Fatalf("stats %+v, want the truncated entry counted corrupt and fetched again", s)
	}
}

func mustOpenCache(t *testing.T, dir string) *Cache {
	t.Helper()
	c, err := Open(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
