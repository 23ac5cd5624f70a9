package pull

import (
	"strings"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// target is where part of a chunk goes: a range of a file being written.
type target struct {
	file              int // entry number in the index
	fileOff, chunkOff int64
	n                 int64
}

// slot names a target by its file and extent, and where the extent starts
// in the file, in 16 bytes: a pull holds one per extent still to write, and
// resolves a chunk's into targets only while it writes that chunk. The
// offset is summed once per file, as the pull plans it: summing a file's
// earlier extents for each would be quadratic in its extents.
type slot struct {
	file, ext int32
	fileOff   int64
}

// resolve returns the targets the slots ss of x name.
func resolve(x *layout.Index, ss []slot) []target {
	ts := make([]target, len(ss))
	for k, s := range ss {
		e := x.Extent(int(s.file), int(s.ext))
		ts[k] = target{file: int(s.file), fileOff: s.fileOff, chunkOff: e.Offset, n: e.Length}
	}
	return ts
}

// targetSlots returns, for each chunk of x, an empty slice with room for a
// slot per extent of a regular file in that chunk: the slots of a pull are
// appended without growing, in one allocation.
func targetSlots(x *layout.Index) [][]slot {
	counts := make([]int, x.NumChunks())
	total := 0
	for i := range x.Len() {
		for k := range x.NumExtents(i) {
			counts[x.Extent(i, k).Chunk]++
			total++
		}
	}
	flat := make([]slot, total)
	out := make([][]slot, x.NumChunks())
	off := 0
	for k, n := range counts {
		out[k] = flat[off : off : off+n]
		off += n
	}
	return out
}

// fileAt returns a copy of entry i of x to pass by pointer.
func fileAt(x *layout.Index, i int) *layout.File {
	f := x.File(i)
	return &f
}

// sizeOf returns the size of entry i of x, the sum of its extents, without
// expanding the entry.
func sizeOf(x *layout.Index, i int) int64 {
	var n int64
	for k := range x.NumExtents(i) {
		n += x.Extent(i, k).Length
	}
	return n
}

// parentOf is the directory of the slash-separated path p ("" at the top).
func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}
