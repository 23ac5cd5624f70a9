package layout

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// orderFetcher records every fetch of the store behind it: how often each
// blob is fetched, the most piece fetches in flight at once, and whether a
// piece fetch began while the top-level index was still being fetched
// (the top's fetch waits up to a second for one to, as a slow link would).
type orderFetcher struct {
	content.Fetcher
	mu           sync.Mutex
	count        map[digest.Digest]int
	inFlight     int
	maxInFlight  int
	pieceStarted chan struct{}
	once         sync.Once
	overlapped   bool
}

func (f *orderFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	f.mu.Lock()
	f.count[d.Digest]++
	f.mu.Unlock()
	switch d.MediaType {
	case MediaTypeIndexV2:
		select {
		case <-f.pieceStarted:
			f.mu.Lock()
			f.overlapped = true
			f.mu.Unlock()
		case <-time.After(time.Second):
		}
	case MediaTypePiece:
		f.once.Do(func() { close(f.pieceStarted) })
		f.mu.Lock()
		f.inFlight++
		f.maxInFlight = max(f.maxInFlight, f.inFlight)
		f.mu.Unlock()
		time.Sleep(5 * time.Millisecond) // a round trip, so that fetches overlap
		defer func() {
			f.mu.Lock()
			f.inFlight--
			f.mu.Unlock()
		}()
	}
	return f.Fetcher.Fetch(ctx, d)
}

// manyFiles is a valid index of n small files sharing one chunk.
func manyFiles(n int) *Index {
	c := Chunk{Digest: digest.FromString("c"), Size: int64(10 * n)}
	x := &Index{Version: FormatVersion, Chunking: DefaultParams, Chunks: []Chunk{c}, Files: []File{{Path: "d", Type: TypeDir, Mode: 0o755}}}
	for i := range n {
		x.Files = append(x.Files, File{Path: fmt.Sprintf("d/f%03d", i), Type: TypeFile, Mode: 0o644, Size: 10,
			Digest: digest.FromString(fmt.Sprint(i)), Extents: []Extent{{0, int64(10 * i), 10}}})
	}
	return x
}

// TestOpenFetchesPiecesAhead: opening a version 2 index fetches its pieces
// while the top-level index is fetched, several at once but no more than
// piecesAhead, each exactly once, and the index read back is the same.
func TestOpenFetchesPiecesAhead(t *testing.T) {
	x := manyFiles(60)
	top, pieces, err := encodeV2(x, smallPieces)
	if err != nil {
		t.Fatal(err)
	}
	if len(pieces) <= piecesAhead {
		t.Fatalf("%d pieces, want more than %d", len(pieces), piecesAhead)
	}
	store, root := storeV2(t, top, pieces, x.Chunks)
	f := &orderFetcher{Fetcher: store, count: map[digest.Digest]int{}, pieceStarted: make(chan struct{})}
	v, err := Open(context.Background(), f, root)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := x.Encode()
	if got, err := v.Index.Encode(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %s (%v), want %s", got, err, want)
	}
	if !f.overlapped {
		t.Error("no piece was fetched while the top-level index was")
	}
	if f.maxInFlight < 2 || f.maxInFlight > piecesAhead {
		t.Errorf("%d piece fetches in flight at most, want 2 to %d", f.maxInFlight, piecesAhead)
	}
	for _, p := range append([][]byte{top}, pieces...) {
		if n := f.count[digest.FromBytes(p)]; n != 1 {
			t.Errorf("blob %s fetched %d times, want 1", digest.FromBytes(p), n)
		}
	}
}

// TestOpenPiecesAheadStopped: an open that fails on a bad top-level index
// returns with no piece fetch left running.
func TestOpenPiecesAheadStopped(t *testing.T) {
	x := manyFiles(60)
	_, pieces, err := encodeV2(x, smallPieces)
	if err != nil {
		t.Fatal(err)
	}
	store, root := storeV2(t, []byte(`{"not":"a top-level index"}`), pieces, x.Chunks)
	f := &orderFetcher{Fetcher: store, count: map[digest.Digest]int{}, pieceStarted: make(chan struct{})}
	if _, err := Open(context.Background(), f, root); err == nil {
		t.Fatal("opened a version with a bad top-level index")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inFlight != 0 {
		t.Errorf("%d piece fetches still running after Open returned", f.inFlight)
	}
}

// deltaTableFetcher records whether the delta table's fetch began while
// the top-level index was being fetched (the top's fetch waits up to a
// second for it to, as a slow link would), and how often each blob is
// fetched.
type deltaTableFetcher struct {
	content.Fetcher
	mu         sync.Mutex
	count      map[digest.Digest]int
	started    chan struct{}
	once       sync.Once
	overlapped bool
}

func (f *deltaTableFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	f.mu.Lock()
	f.count[d.Digest]++
	f.mu.Unlock()
	switch d.MediaType {
	case MediaTypeIndexV3, MediaTypeIndexV4:
		select {
		case <-f.started:
			f.mu.Lock()
			f.overlapped = true
			f.mu.Unlock()
		case <-time.After(time.Second):
		}
	case MediaTypeDeltas:
		f.once.Do(func() { close(f.started) })
	}
	return f.Fetcher.Fetch(ctx, d)
}

// TestOpenFetchesDeltaTableAhead: opening a version with deltas fetches
// its delta table while the top-level index is fetched, once, not one
// round trip after the pieces.
func TestOpenFetchesDeltaTableAhead(t *testing.T) {
	store, root, _, _ := deltaVersion(t, func(plain, base []byte) []byte {
		d, _ := EncodeDelta(plain, base, Planes16)
		return d
	})
	f := &deltaTableFetcher{Fetcher: store, count: map[digest.Digest]int{}, started: make(chan struct{})}
	v, err := Open(context.Background(), f, root)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Index.Deltas()) != 1 {
		t.Fatalf("%d deltas read, want 1", len(v.Index.Deltas()))
	}
	if !f.overlapped {
		t.Error("the delta table was not fetched while the top-level index was")
	}
	for d, n := range f.count {
		if n != 1 {
			t.Errorf("blob %s fetched %d times, want 1", d, n)
		}
	}
}
