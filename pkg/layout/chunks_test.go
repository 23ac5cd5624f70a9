package layout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// TestChunkTable: chunks come back as they were added (without edges when
// they are skipped), are found by digest past several growths of the set,
// and a second listing that differs in size or edges is told apart.
func TestChunkTable(t *testing.T) {
	const n = 3*chunkBlock + 17
	chunks := make([]Chunk, n)
	for i := range chunks {
		chunks[i] = Chunk{Digest: digest.FromString(fmt.Sprint("c", i)), Size: int64(1 + i)}
		if i%3 == 0 {
			chunks[i].Size = EdgeMinChunk + int64(i)
			chunks[i].Head, chunks[i].Tail = digest.FromString(fmt.Sprint("h", i)), digest.FromString(fmt.Sprint("t", i))
		}
	}
	for _, skip := range []bool{false, true} {
		tb := newChunkTable(skip)
		for _, c := range chunks {
			if err := tb.add(c); err != nil {
				t.Fatal(err)
			}
		}
		if tb.len() != n {
			t.Fatalf("skip %v: %d chunks, want %d", skip, tb.len(), n)
		}
		for k, c := range chunks {
			want := c
			if skip {
				want.Head, want.Tail = "", ""
			}
			if got := tb.chunk(k); got != want {
				t.Fatalf("skip %v: chunk %d = %+v, want %+v", skip, k, got, want)
			}
			sum, _ := SHA256Sum(c.Digest)
			if got, ok := tb.lookup(&sum); !ok || got != k {
				t.Fatalf("skip %v: lookup of chunk %d: %d, %v", skip, k, got, ok)
			}
			if !tb.equal(k, c) {
				t.Fatalf("skip %v: chunk %d is not equal to itself", skip, k)
			}
			other := c
			other.Size++
			if tb.equal(k, other) {
				t.Fatalf("skip %v: chunk %d equals one of another size", skip, k)
			}
			if c.HasEdges() {
				other = c
				other.Tail = digest.FromString("another tail")
				if tb.equal(k, other) {
					t.Fatalf("skip %v: chunk %d equals one with another tail", skip, k)
				}
				other.Head, other.Tail = "", ""
				if tb.equal(k, other) {
					t.Fatalf("skip %v: chunk %d equals one without edges", skip, k)
				}
			}
		}
		absent, _ := SHA256Sum(digest.FromString("absent"))
		if _, ok := tb.lookup(&absent); ok {
			t.Fatalf("skip %v: found a chunk never added", skip)
		}
	}
	for _, d := range []digest.Digest{"sha256:" + digest.Digest(strings.Repeat("A", 64)), "sha512:00", digest.FromString("x")[:70]} {
		if _, ok := SHA256Sum(d); ok {
			t.Errorf("SHA256Sum(%q) accepted", d)
		}
	}
}

// edgeIndex is v2Index with edges on its first chunk, which two pieces of
// smallPieces list.
func edgeIndex() *Index {
	x := v2Index()
	x.Chunks[0].Size = EdgeMinChunk
	x.Chunks[0].Head, x.Chunks[0].Tail = digest.FromString("head"), digest.FromString("tail")
	return x
}

// TestOpenSkipEdges: a version opened with SkipEdges has the same chunks
// without their edges, and what Open refuses (a second listing of a chunk
// with other edges) it refuses too.
func TestOpenSkipEdges(t *testing.T) {
	x := edgeIndex()
	top, pieces, err := encodeV2(x, smallPieces)
	if err != nil {
		t.Fatal(err)
	}
	listed := 0
	for _, p := range pieces {
		listed += strings.Count(string(p), x.Chunks[0].Tail.String())
	}
	if listed < 2 {
		t.Fatalf("premise: the chunk with edges is listed by %d pieces", listed)
	}
	store, root := storeV2(t, top, pieces, x.Chunks)
	ctx := context.Background()
	full, err := Open(ctx, store, root)
	if err != nil {
		t.Fatal(err)
	}
	skipped, err := OpenWith(ctx, store, root, OpenOptions{SkipEdges: true})
	if err != nil {
		t.Fatal(err)
	}
	if full.NumChunks() != len(x.Chunks) || skipped.NumChunks() != len(x.Chunks) {
		t.Fatalf("%d and %d chunks, want %d", full.NumChunks(), skipped.NumChunks(), len(x.Chunks))
	}
	for k, c := range x.Chunks {
		if got := full.Index.Chunk(k); got != c {
			t.Errorf("chunk %d: %+v, want %+v", k, got, c)
		}
		if got := skipped.Index.Chunk(k); got.Digest != c.Digest || got.Size != c.Size || got.HasEdges() {
			t.Errorf("chunk %d with edges skipped: %+v", k, got)
		}
		if d := skipped.Chunk(k); d.MediaType != MediaTypeChunk || d.Digest != c.Digest || d.Size != c.Size {
			t.Errorf("chunk %d: descriptor %+v", k, d)
		}
	}

	// The last piece that lists the chunk gives it another tail.
	last := -1
	for i, p := range pieces {
		if strings.Contains(string(p), x.Chunks[0].Tail.String()) {
			last = i
		}
	}
	bad := append([][]byte{}, pieces...)
	bad[last] = []byte(strings.Replace(string(bad[last]), x.Chunks[0].Tail.String(), digest.FromString("other").String(), 1))
	tp, err := decodeTop(top)
	if err != nil {
		t.Fatal(err)
	}
	tp.Pieces[last].Digest, tp.Pieces[last].Size = digest.FromBytes(bad[last]), int64(len(bad[last]))
	badTop, err := canonicalJSON(tp)
	if err != nil {
		t.Fatal(err)
	}
	store, root = storeV2(t, badTop, bad, x.Chunks)
	for _, opt := range []OpenOptions{{}, {SkipEdges: true}} {
		if _, err := OpenWith(ctx, store, root, opt); !errors.Is(err, ErrInvalidIndex) || !strings.Contains(err.Error(), "earlier listing") {
			t.Errorf("%+v: a chunk listed again with another tail: %v, want ErrInvalidIndex", opt, err)
		}
	}
}
