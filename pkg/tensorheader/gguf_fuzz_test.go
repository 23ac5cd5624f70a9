package tensorheader

import (
	"bytes"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// FuzzGGUFHeader parses arbitrary bytes as a GGUF file: it must refuse or
// return tensors inside the file, sorted, not overlapping, never panic.
func FuzzGGUFHeader(f *testing.F) {
	f.Add(testutil.GGUFCheckpoint(2, 64, func(i int) uint64 { return uint64(i) }))
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		size := int64(len(b))
		h, err := ReadGGUFHeader(bytes.NewReader(b), size, 1<<20)
		if err != nil {
			return
		}
		if h.DataStart > size || h.DataStart%int64(h.Alignment) != 0 {
			t.Fatalf("data at %d (alignment %d) in %d bytes", h.DataStart, h.Alignment, size)
		}
		for i, x := range h.Tensors {
			if x.Begin < h.DataStart || x.End > size || x.End < x.Begin || (i > 0 && x.Begin < h.Tensors[i-1].End) {
				t.Fatalf("bad tensor %+v", x)
			}
		}
		for _, r := range h.Ranges(size) {
			if r.End < r.Begin || r.End > size {
				t.Fatalf("bad range %+v", r)
			}
		}
	})
}
