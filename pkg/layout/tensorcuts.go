package layout

import (
	"io"

	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// FormatCuts returns the cut points of a weights file whose header lists
// its tensors (safetensors, GGUF: by the name's suffix) and reads, and
// whether there are any: false means the file is cut content-defined.
func FormatCuts(r io.ReaderAt, name string, size int64, p Params) ([]int64, bool) {
	switch {
	case tensorheader.IsSafetensors(name):
		if hdrEnd, ts, err := tensorheader.ReadSafetensorsHeader(r, size); err == nil {
			return tensorBoundaries(hdrEnd, ts, size, p), true
		}
	case tensorheader.IsGGUF(name):
		if h, err := tensorheader.ReadGGUFHeader(r, size, tensorheader.GGUFHeaderLimit); err == nil {
			return tensorBoundaries(h.DataStart, h.Ranges(size), size, p), true
		}
	}
	return nil, false
}

// tensorBoundaries returns the cut points of a safetensors file: after the
// header, around every tensor of at least p.Min bytes, after runs of small
// tensors once a run reaches p.Min bytes, and every p.Max bytes inside a
// longer piece, counted from the piece's start. Chunks never straddle a
// tensor boundary, so an unchanged tensor gives unchanged chunks wherever
// it moves in the file.
func tensorBoundaries(hdrEnd int64, ts []tensorheader.Tensor, size int64, p Params) []int64 {
	var marks []int64 // piece boundaries
	group := hdrEnd
	add := func(x int64) {
		if x > 0 && x < size && (len(marks) == 0 || x > marks[len(marks)-1]) {
			marks = append(marks, x)
		}
	}
	add(hdrEnd)
	for _, t := range ts {
		if t.End-t.Begin >= p.Min {
			add(t.Begin)
			add(t.End)
			group = t.End
			continue
		}
		if t.End-group >= p.Min {
			add(t.End)
			group = t.End
		}
	}
	// Split pieces longer than p.Max into p.Max-sized chunks.
	var cuts []int64
	prev := int64(0)
	for _, m := range append(marks, size) {
		for x := prev + p.Max; x < m; x += p.Max {
			cuts = append(cuts, x)
		}
		if m < size {
			cuts = append(cuts, m)
		}
		prev = m
	}
	return cuts
}
