package layout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// ggufCheckpoint is a generated GGUF model: n F16 matrices of big bytes
// each, a small F32 norm after each, the data of tensor i from seed+i.
func ggufCheckpoint(n, big int, seed func(i int) uint64) []byte {
	var ts []testutil.GGUFTensor
	for i := range n {
		ts = append(ts,
			testutil.GGUFTensor{Name: fmt.Sprintf("blk.%d.attn_q.weight", i), Type: 1, Dims: []uint64{uint64(big / 2 / 64), 64}, Data: testutil.RandBytes(seed(i), big)},
			testutil.GGUFTensor{Name: fmt.Sprintf("blk.%d.attn_norm.weight", i), Type: 0, Dims: []uint64{250}, Data: testutil.RandBytes(seed(i)+1<<32, 1000)})
	}
	return testutil.GGUF([]string{"general.architecture", "llama", "general.name", "test"}, 32, ts)
}

func TestGGUFHeader(t *testing.T) {
	b := ggufCheckpoint(3, 4096, func(i int) uint64 { return uint64(i) })
	h, err := ReadGGUFHeader(bytes.NewReader(b), int64(len(b)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != 3 || h.Alignment != 32 || h.Architecture != "llama" || len(h.Tensors) != 6 || h.DataStart%32 != 0 {
		t.Fatalf("header %+v", h)
	}
	pos := h.DataStart
	for _, x := range h.Tensors {
		if x.Begin != pos || x.Begin%32 != 0 {
			t.Fatalf("tensor %s at %d, want %d", x.Name, x.Begin, pos)
		}
		want := int64(4096)
		if x.Type == 0 {
			want = 1000
		}
		if x.End-x.Begin != want {
			t.Fatalf("tensor %s (%s): %d bytes, want %d", x.Name, x.Dtype(), x.End-x.Begin, want)
		}
		pos = (x.End + 31) / 32 * 32
	}
	rs := h.Ranges(int64(len(b)))
	if rs[1].End != rs[2].Begin || rs[5].End != int64(len(b)) {
		t.Fatalf("ranges do not run to the next tensor: %+v", rs)
	}
}

// TestGGUFHeaderRefused: broken or hostile headers are refused with
// ErrGGUF, without allocating what they claim.
func TestGGUFHeaderRefused(t *testing.T) {
	good := ggufCheckpoint(1, 4096, func(i int) uint64 { return 1 })
	u64 := func(b []byte, off int, v uint64) []byte {
		c := bytes.Clone(b)
		for i := range 8 {
			c[off+i] = byte(v >> (8 * i))
		}
		return c
	}
	cases := map[string][]byte{
		"truncated":     good[:40],
		"magic":         append([]byte("GGML"), good[4:]...),
		"version 1":     append([]byte("GGUF\x01\x00\x00\x00"), good[8:]...),
		"tensor count":  u64(good, 8, 1<<40),
		"kv count":      u64(good, 16, 1<<40),
		"key length":    u64(good, 24, 1<<62),
		"short of data": good[:len(good)-100],
	}
	for name, b := range cases {
		_, err := ReadGGUFHeader(bytes.NewReader(b), int64(len(b)), 0)
		if !errors.Is(err, ErrGGUF) {
			t.Errorf("%s: got %v, want ErrGGUF", name, err)
		}
	}
	if _, err := ReadGGUFHeader(bytes.NewReader(good), int64(len(good)), 100); !errors.Is(err, ErrGGUF) {
		t.Errorf("header past the limit: got %v", err)
	}
}

// TestGGUFFineTuneDedup pushes a generated GGUF checkpoint, then a
// fine-tune of it with a quarter of its big tensors changed, and checks
// that the second push uploads within 1.05x of the changed tensors' bytes.
// The same file under a name without .gguf (cut content-defined) is the
// comparison.
func TestGGUFFineTuneDedup(t *testing.T) {
	const n, big = 24, 3 << 20
	base := func(i int) uint64 { return uint64(100 + i) }
	changed := map[int]bool{3: true, 7: true, 11: true, 15: true, 19: true, 23: true}
	tuned := func(i int) uint64 {
		if changed[i] {
			return uint64(9000 + i)
		}
		return base(i)
	}
	v1, v2 := ggufCheckpoint(n, big, base), ggufCheckpoint(n, big, tuned)
	changedBytes := int64(len(changed)) * (big + 1000)
	for _, name := range []string{"model.gguf", "model.bin"} {
		ctx := context.Background()
		st := &countingStore{Storage: memory.New()}
		dir := t.TempDir()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, v1, 0o644); err != nil {
			t.Fatal(err)
		}
		first, err := Push(ctx, st, DirSource(dir), PushOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, v2, 0o644); err != nil {
			t.Fatal(err)
		}
		st.bytes.Store(0)
		second, err := Push(ctx, st, DirSource(dir), PushOptions{Params: first.Index.Chunking})
		if err != nil {
			t.Fatal(err)
		}
		up := st.bytes.Load()
		ratio := float64(up) / float64(changedBytes)
		t.Logf("%s: %d bytes, %d chunks; fine-tune changed %d tensor bytes, re-push uploaded %d bytes (%.3fx), dedup %.1f%%",
			name, len(v2), second.Chunks, changedBytes, up, ratio, 100*(1-float64(up)/float64(len(v2))))
		if name == "model.gguf" && ratio > 1.05 {
			t.Fatalf("GGUF fine-tune re-uploaded %d bytes, %.3fx the %d changed tensor bytes (want at most 1.05x)", up, ratio, changedBytes)
		}
	}
}

// TestGGUFCutStreamMatchesCutFile: a GGUF file cut as a stream (import)
// gives the chunks CutFile (push) gives, at tensor boundaries.
func TestGGUFCutStreamMatchesCutFile(t *testing.T) {
	b := ggufCheckpoint(4, 300<<10, func(i int) uint64 { return uint64(7 + i) })
	p := Params{Min: 64 << 10, Avg: 128 << 10, Max: 256 << 10}
	type cut struct {
		off int64
		d   string
	}
	var file, stream []cut
	ctx := context.Background()
	if err := CutFile(ctx, bytes.NewReader(b), "m.gguf", int64(len(b)), p, func(off int64, d digest.Digest) { file = append(file, cut{off, d.String()}) }); err != nil {
		t.Fatal(err)
	}
	if err := CutStream(ctx, bytes.NewReader(b), "m.gguf", int64(len(b)), p, func(off int64, c Chunk) { stream = append(stream, cut{off, c.Digest.String()}) }); err != nil {
		t.Fatal(err)
	}
	h, err := ReadGGUFHeader(bytes.NewReader(b), int64(len(b)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(file, stream) || len(file) < 9 || file[1].off != h.DataStart {
		t.Fatalf("CutFile %v\nCutStream %v\n(data at %d)", file, stream, h.DataStart)
	}
}
