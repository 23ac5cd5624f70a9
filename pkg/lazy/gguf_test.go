package lazy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// ggufFixture pushes a volume holding one GGUF file whose header (a long
// vocabulary string) spans several chunks, with F32 tensors of 100 KiB
// and small norms between them.
func ggufFixture(t *testing.T) (*fixture, []byte, *tensorheader.GGUFHeader) {
	t.Helper()
	var ts []testutil.GGUFTensor
	for i := range 6 {
		ts = append(ts,
			testutil.GGUFTensor{Name: fmt.Sprintf("blk.%d.ffn.weight", i), Type: 0, Dims: []uint64{25600}, Data: testutil.RandBytes(uint64(10+i), 100<<10)},
			testutil.GGUFTensor{Name: fmt.Sprintf("blk.%d.norm.weight", i), Type: 0, Dims: []uint64{250}, Data: testutil.RandBytes(uint64(20+i), 1000)})
	}
	vocab := strings.Repeat("token ", 30_000) // 180 KiB: a header of several 64 KiB chunks
	b := testutil.GGUF([]string{"general.architecture", "llama", "tokenizer.ggml.tokens", vocab}, 32, ts)
	h, err := tensorheader.ReadGGUFHeader(bytes.NewReader(b), int64(len(b)), 0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.gguf"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	store := memory.New()
	res, err := push.Push(context.Background(), store, push.DirSource(dir), push.Options{Params: testParams})
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{files: map[string][]byte{"model.gguf": b}, store: store, root: res.Root,
		fetch: &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}}
	return fx, b, h
}

// chunksOf returns the digests of the chunks holding [from, to) of f.
func chunksOf(f *File, from, to int64) map[digest.Digest]bool {
	out := map[digest.Digest]bool{}
	for k, x := range f.e.Extents {
		if f.starts[k] < to && f.starts[k]+x.Length > from {
			out[f.v.ver.Chunk(x.Chunk).Digest] = true
		}
	}
	return out
}

// TestPrefetchHeadersGGUF checks that the header prefetch fetches exactly
// the chunks of a GGUF file's header (header, tensor records, padding up
// to the tensor data), none of its tensors, and parses its tensor map; and
// that a tensor read afterwards fetches no header chunk and little past
// the tensor.
func TestPrefetchHeadersGGUF(t *testing.T) {
	ctx := context.Background()
	fx, b, h := ggufFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	f, err := v.Open("model.gguf")
	if err != nil {
		t.Fatal(err)
	}
	want := chunksOf(f, 0, h.DataStart)
	if len(want) < 3 {
		t.Fatalf("the header of %d bytes is in %d chunks, want several", h.DataStart, len(want))
	}
	fx.fetch.reset()
	if err := v.PrefetchHeaders(ctx); err != nil {
		t.Fatal(err)
	}
	fx.fetch.mu.Lock()
	got := map[digest.Digest]bool{}
	for d, n := range fx.fetch.fetches {
		got[d] = true
		if n != 1 {
			t.Errorf("chunk %s fetched %d times", d, n)
		}
	}
	bytesFetched := fx.fetch.bytes
	fx.fetch.mu.Unlock()
	t.Logf("header prefetch: %d chunks, %d bytes; the header is %d bytes", len(got), bytesFetched, h.DataStart)
	for d := range want {
		if !got[d] {
			t.Errorf("header chunk %s not prefetched", d)
		}
	}
	for d := range got {
		if !want[d] {
			t.Errorf("chunk %s prefetched, not a header chunk", d)
		}
	}
	if bytesFetched != h.DataStart {
		t.Errorf("header prefetch fetched %d bytes, want the header's %d", bytesFetched, h.DataStart)
	}

	f.mu.Lock()
	parsed, rs := f.parsed, f.tensors
	f.mu.Unlock()
	if !parsed || len(rs) != 1+len(h.Tensors) || rs[0] != (region{0, h.DataStart}) {
		t.Fatalf("after the prefetch: parsed %v, %d regions (want %d), header %v", parsed, len(rs), 1+len(h.Tensors), rs[:min(1, len(rs))])
	}

	// A loader reading one tensor from its start, in 16 KiB reads.
	fx.fetch.reset()
	r := rs[5] // blk.2.ffn.weight
	buf := make([]byte, r.end-r.begin)
	for off := int64(0); off < int64(len(buf)); off += 16 << 10 {
		end := min(off+16<<10, int64(len(buf)))
		if _, err := f.ReadAt(buf[off:end], r.begin+off); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(buf, b[r.begin:r.end]) {
		t.Fatal("tensor bytes differ")
	}
	v.Close() // wait for readahead
	fx.fetch.mu.Lock()
	defer fx.fetch.mu.Unlock()
	for d := range fx.fetch.fetches {
		if want[d] {
			t.Errorf("the tensor read fetched header chunk %s again", d)
		}
	}
	if limit := (r.end - r.begin) + 2*testParams.Max; fx.fetch.bytes > limit {
		t.Errorf("reading a %d-byte tensor fetched %d bytes, limit %d", r.end-r.begin, fx.fetch.bytes, limit)
	}
	t.Logf("one tensor of %d bytes: %d bytes fetched", r.end-r.begin, fx.fetch.bytes)
}

// TestGGUFHeaderRefusedReadsBytes checks that a file named .gguf whose
// header does not parse gets no tensor map and still reads byte by byte.
func TestGGUFHeaderRefusedReadsBytes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b := append([]byte("GGUF\x07\x00\x00\x00"), testutil.RandBytes(3, 300<<10)...)
	if err := os.WriteFile(filepath.Join(dir, "bad.gguf"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	store := memory.New()
	res, err := push.Push(ctx, store, push.DirSource(dir), push.Options{Params: testParams})
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{store: store, root: res.Root, fetch: &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}}
	v := fx.open(t, t.TempDir(), Options{})
	if err := v.PrefetchHeaders(ctx); err != nil {
		t.Fatal(err)
	}
	f, err := v.Open("bad.gguf")
	if err != nil {
		t.Fatal(err)
	}
	if rs := f.regions(ctx); rs != nil {
		t.Fatalf("a bad header gave regions %v", rs)
	}
	if got := readAll(t, f); !bytes.Equal(got, b) {
		t.Fatal("contents differ")
	}
}
