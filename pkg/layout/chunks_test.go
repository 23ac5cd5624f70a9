package layout

import (
	"fmt"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// TestChunkTable: chunks come back as they were added, are found by
// digest past several growths of the set, and a second listing that
// differs in size or edges is told apart.
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
	tb := newChunkTable()
	for _, c := range chunks {
		if err := tb.add(c); err != nil {
			t.Fatal(err)
		}
	}
	if tb.len() != n {
		t.Fatalf("%d chunks, want %d", tb.len(), n)
	}
	for k, c := range chunks {
		if got := tb.chunk(k); got != c {
			t.Fatalf("chunk %d = %+v, want %+v", k, got, c)
		}
		sum, _ := sha256Of(c.Digest)
		if got, ok := tb.lookup(&sum); !ok || got != k {
			t.Fatalf("lookup of chunk %d: %d, %v", k, got, ok)
		}
		if !tb.equal(k, c) {
			t.Fatalf("chunk %d is not equal to itself", k)
		}
		other := c
		other.Size++
		if tb.equal(k, other) {
			t.Fatalf("chunk %d equals one of another size", k)
		}
		if c.HasEdges() {
			other = c
			other.Tail = digest.FromString("another tail")
			if tb.equal(k, other) {
				t.Fatalf("chunk %d equals one with another tail", k)
			}
			other.Head, other.Tail = "", ""
			if tb.equal(k, other) {
				t.Fatalf("chunk %d equals one without edges", k)
			}
		}
	}
	absent, _ := sha256Of(digest.FromString("absent"))
	if _, ok := tb.lookup(&absent); ok {
		t.Fatal("found a chunk never added")
	}
	for _, d := range []digest.Digest{"sha256:" + digest.Digest(strings.Repeat("A", 64)), "sha512:00", digest.FromString("x")[:70]} {
		if _, ok := sha256Of(d); ok {
			t.Errorf("sha256Of(%q) accepted", d)
		}
	}
}
