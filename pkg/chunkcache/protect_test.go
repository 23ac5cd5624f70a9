package chunkcache

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// TestProtectedSurviveEviction checks that eviction takes unprotected
// entries first, however recently used, that Remove refuses protected ones,
// and that protected entries go only when they alone exceed the bound.
func TestProtectedSurviveEviction(t *testing.T) {
	ctx := context.Background()
	store := memory.New()
	var descs []ocispec.Descriptor
	for i := range 6 {
		b := bytes.Repeat([]byte(fmt.Sprintf("blob %d ", i)), 128) // ~1 KiB
		d := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(b), Size: int64(len(b))}
		if err := store.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		descs = append(descs, d)
	}
	c := mustOpenCache(t, t.TempDir())
	c.max = 4 * descs[0].Size
	load := func(d ocispec.Descriptor) {
		ch, err := c.Load(ctx, store, d)
		if err != nil {
			t.Fatal(err)
		}
		ch.Close()
	}
	c.Protect("mount:a", descs[:2])
	for _, d := range descs[:4] {
		load(d)
	}
	// 0 and 1 are the least recently used but protected: 2 goes, then 3.
	load(descs[4])
	load(descs[5])
	for i, want := range []bool{true, true, false, false, true, true} {
		if got := c.Contains(descs[i].Digest); got != want {
			t.Fatalf("blob %d cached: %v, want %v", i, got, want)
		}
	}
	if c.Size() > c.Max() {
		t.Fatalf("size %d past the bound %d", c.Size(), c.Max())
	}
	if c.Remove(descs[0].Digest) || !c.Contains(descs[0].Digest) {
		t.Fatal("Remove took a protected entry")
	}
	if !c.Remove(descs[4].Digest) || c.Contains(descs[4].Digest) {
		t.Fatal("Remove kept an unprotected entry")
	}
	if got := c.Protected(func(string) bool { return true }); len(got) != 2 {
		t.Fatalf("protected %v, want 2 digests", got)
	}
	// Protected entries past the bound: the bound wins.
	c.Unprotect("mount:a")
	c.Protect("warm:b", descs)
	for _, d := range descs {
		load(d)
	}
	if c.Size() > c.Max() {
		t.Fatalf("size %d past the bound %d with everything protected", c.Size(), c.Max())
	}
}

// A digest that is not a sha256 digest of 64 hex digits names no entry:
// Remove, EntrySize and Contains do not turn it into a path.
func TestMalformedDigestsNameNoEntry(t *testing.T) {
	top := t.TempDir()
	c, err := Open(filepath.Join(top, "cache"), 0)
	if err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(top, "victim")
	if err := os.WriteFile(victim, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []digest.Digest{"sha256:../../victim", "sha256:../../victim/../victim", "md5:../../victim"} {
		if _, ok := c.EntrySize(d); ok || c.Contains(d) || c.Has(d) {
			t.Errorf("%s: found an entry", d)
		}
		if c.Remove(d) {
			t.Errorf("%s: removed", d)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("the file outside the cache: %v", err)
	}
}
