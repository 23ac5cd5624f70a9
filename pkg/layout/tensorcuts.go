package layout

import "io"

// formatCuts returns the cut points of a weights file whose header lists
// its tensors (safetensors, GGUF: by the name's suffix) and reads, and
// whether there are any: false means the file is cut content-defined.
func formatCuts(r io.ReaderAt, name string, size int64, p Params) ([]int64, bool) {
	switch {
	case IsSafetensors(name):
		if hdrEnd, ts, err := ReadSafetensorsHeader(r, size); err == nil {
			return tensorBoundaries(hdrEnd, ts, size, p), true
		}
	case IsGGUF(name):
		if h, err := ReadGGUFHeader(r, size, GGUFHeaderLimit); err == nil {
			return tensorBoundaries(h.DataStart, h.Ranges(size), size, p), true
		}
	}
	return nil, false
}
