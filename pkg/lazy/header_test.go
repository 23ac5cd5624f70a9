package lazy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// hostileHeaders stores a version whose safetensors files each declare a
// header of the given length but are made of one small chunk repeated: the
// header length is all an attacker controls cheaply.
func hostileHeaders(t *testing.T, files int, declared int64) (*memory.Store, ocispec.Descriptor, []byte, int64) {
	t.Helper()
	ctx := context.Background()
	chunk := bytes.Repeat([]byte{'x'}, 1<<20)
	binary.LittleEndian.PutUint64(chunk, uint64(declared))
	reps := (declared+8)/int64(len(chunk)) + 1
	size := reps * int64(len(chunk))
	h := sha256.New()
	for range reps {
		h.Write(chunk)
	}
	cd := digest.FromBytes(chunk)
	x := &layout.Index{Version: layout.FormatVersion, Chunking: testParams,
		Chunks: []layout.Chunk{{Digest: cd, Size: int64(len(chunk))}}}
	ext := make([]layout.Extent, reps)
	for i := range ext {
		ext[i] = layout.Extent{Chunk: 0, Offset: 0, Length: int64(len(chunk))}
	}
	for i := range files {
		x.Files = append(x.Files, layout.File{Path: fmt.Sprintf("m-%02d.safetensors", i), Type: layout.TypeFile, Mode: 0o644,
			Size: size, Digest: digest.NewDigest(digest.SHA256, h), Extents: ext})
	}
	s, err := layout.Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	store := memory.New()
	if err := store.Push(ctx, ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: cd, Size: int64(len(chunk))}, bytes.NewReader(chunk)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, store); err != nil {
		t.Fatal(err)
	}
	return store, s.Root.Desc, chunk, size
}

// TestPrefetchHostileHeadersAllocateLittle checks that safetensors files
// declaring 100 MiB headers, made of one 1 MiB chunk, cost the header
// prefetch no such memory, and that the files still read byte by byte.
func TestPrefetchHostileHeadersAllocateLittle(t *testing.T) {
	ctx := context.Background()
	store, root, chunk, size := hostileHeaders(t, 16, 100<<20)
	fetch := &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}
	c := mustCache(t)
	v, err := Open(ctx, fetch, root, Options{Cache: c})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := v.PrefetchHeaders(ctx); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	got := after.TotalAlloc - before.TotalAlloc
	t.Logf("header prefetch allocated %d KiB", got>>10)
	if got > 16<<20 {
		t.Fatalf("header prefetch of 16 files declaring 100 MiB headers allocated %d MiB", got>>20)
	}
	f, err := v.Open("m-03.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	if rs := f.regions(ctx); rs != nil {
		t.Fatalf("an oversized header gave regions %v", rs)
	}
	for _, off := range []int64{0, 50<<20 + 5, size - 10} {
		got := make([]byte, 10)
		if _, err := f.ReadAt(got, off); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		k := off % int64(len(chunk))
		if !bytes.Equal(got, chunk[k:k+10]) {
			t.Fatalf("read at %d: %x, want %x", off, got, chunk[k:k+10])
		}
	}
}

// TestReadHeaderLimits checks the header cap and the header budget: a
// header over maxHeaderBytes is refused after its length is read, one
// under it is read, and a read waits while the budget is spent.
func TestReadHeaderLimits(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		declared int64
		tooLarge bool
	}{{maxHeaderBytes + 1, true}, {2 << 20, false}} {
		store, root, _, _ := hostileHeaders(t, 1, tc.declared)
		fetch := &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}
		v, err := Open(ctx, fetch, root, Options{Cache: mustCache(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		f, err := v.Open("m-00.safetensors")
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = f.readHeader(ctx, f)
		if got := errors.Is(err, tensorheader.ErrHeaderTooLarge); got != tc.tooLarge {
			t.Fatalf("header of %d bytes: err %v, want too large %v", tc.declared, err, tc.tooLarge)
		}
		if !tc.tooLarge {
			if err == nil {
				t.Fatalf("header of 'x' bytes parsed")
			}
			// With the budget spent, the read waits (here: until its
			// context ends) instead of allocating.
			if !v.headers.TryAcquire(headerBudget) {
				t.Fatal("the header budget is still held")
			}
			cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_, _, err := f.readHeader(cctx, f)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("read with the budget spent: %v, want it to wait", err)
			}
			v.headers.Release(headerBudget)
		}
	}
}
