package tensorheader

import (
	"bytes"
	"errors"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

func TestGGUFHeader(t *testing.T) {
	b := testutil.GGUFCheckpoint(3, 4096, func(i int) uint64 { return uint64(i) })
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
	good := testutil.GGUFCheckpoint(1, 4096, func(i int) uint64 { return 1 })
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
