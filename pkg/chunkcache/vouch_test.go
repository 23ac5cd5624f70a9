package chunkcache

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// A second cache over the same directory (another process) trusts a vouched-for
// entry without hashing it, but an entry written since is hashed and, when
// wrong, dropped rather than served.
func TestCacheVouchedEntries(t *testing.T) {
	dir := t.TempDir()
	data := []byte("verified chunk bytes")
	desc := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(data), Size: int64(len(data))}
	store := memory.New()
	if err := store.Push(context.Background(), desc, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	c1, err := Open(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := c1.Load(context.Background(), store, desc)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	p := c1.path(desc.Digest)
	f, _ := os.Open(p)
	st, _ := f.Stat()
	if !vouchedEntry(f, st) {
		t.Fatal("a stored entry carries no verification mark")
	}
	f.Close()
	// Rewrite the entry with wrong bytes of the same size.
	bad := bytes.ToUpper(data)
	if err := os.WriteFile(p, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	c2, err := Open(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ch, err = c2.Load(context.Background(), store, desc)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	got := make([]byte, len(data))
	if _, err := ch.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("served %q (%v), want %q", got, err, data)
	}
	if c2.Stats().Corrupt != 1 {
		t.Fatalf("corrupt count %d, want the rewritten entry detected", c2.Stats().Corrupt)
	}
}
