package layout

import (
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/opencontainers/go-digest"
)

// entries is the compact in-memory form of an opened index: one string
// for all paths, fixed-size fields in flat arrays, and the extents of all
// files in one array. About 55 bytes plus the path per entry of one
// extent, against about 250 for a []File. A file's size is the sum of its
// extents.
type entries struct {
	arena   strings.Builder // the paths, one after the other
	pathEnd []uint32        // end of path i in the arena
	meta    []uint32        // type<<16 | mode
	sum     [][sha256Len]byte
	extEnd  []uint32 // end of file i's extents in ext
	ext     []extent
	targets map[int]string // symlink targets by entry
}

// extent is an Extent in 12 bytes: chunks are at most 256 MiB.
type extent struct{ chunk, off, length uint32 }

const sha256Len = 32

const (
	kindFile = iota
	kindDir
	kindSymlink
)

var kindNames = [...]string{kindFile: TypeFile, kindDir: TypeDir, kindSymlink: TypeSymlink}

func newEntries(capacity int) *entries {
	return &entries{
		pathEnd: make([]uint32, 0, capacity),
		meta:    make([]uint32, 0, capacity),
		ext:     make([]extent, 0, capacity),
		sum:     make([][sha256Len]byte, 0, capacity),
		extEnd:  make([]uint32, 0, capacity),
		targets: map[int]string{},
	}
}

func (e *entries) len() int { return len(e.pathEnd) }

func (e *entries) path(i int) string {
	s := e.arena.String() // no copy; earlier strings stay valid as it grows
	start := uint32(0)
	if i > 0 {
		start = e.pathEnd[i-1]
	}
	return s[start:e.pathEnd[i]]
}

// add appends a checked entry whose extents already name the index's
// chunks.
func (e *entries) add(f *File) error {
	if uint64(e.arena.Len())+uint64(len(f.Path)) > math.MaxUint32 || uint64(len(e.ext))+uint64(len(f.Extents)) > math.MaxUint32 {
		return invalid("index too large to hold (at %q)", f.Path)
	}
	var kind uint32
	switch f.Type {
	case TypeDir:
		kind = kindDir
	case TypeSymlink:
		kind = kindSymlink
		e.targets[e.len()] = f.Target
	}
	var sum [sha256Len]byte
	if f.Digest != "" {
		if _, err := hex.Decode(sum[:], []byte(f.Digest.Encoded())); err != nil {
			return invalid("%q: bad digest %q", f.Path, f.Digest)
		}
	}
	e.arena.WriteString(f.Path)
	e.pathEnd = append(e.pathEnd, uint32(e.arena.Len()))
	e.meta = append(e.meta, kind<<16|f.Mode)
	e.sum = append(e.sum, sum)
	for _, x := range f.Extents {
		if x.Chunk < 0 || x.Chunk > math.MaxUint32 || x.Offset < 0 || x.Offset > math.MaxUint32 || x.Length < 0 || x.Length > math.MaxUint32 {
			return invalid("%q: extent [%d,%d,%d] out of range", f.Path, x.Chunk, x.Offset, x.Length)
		}
		e.ext = append(e.ext, extent{uint32(x.Chunk), uint32(x.Offset), uint32(x.Length)})
	}
	e.extEnd = append(e.extEnd, uint32(len(e.ext)))
	return nil
}

func (e *entries) file(i int) File {
	m := e.meta[i]
	f := File{Path: e.path(i), Type: kindNames[m>>16], Mode: m & 0o7777}
	switch m >> 16 {
	case kindFile:
		f.Digest = digest.Digest("sha256:" + hex.EncodeToString(e.sum[i][:]))
		exts := e.extents(i)
		if len(exts) > 0 {
			f.Extents = make([]Extent, len(exts))
			for k, x := range exts {
				f.Extents[k] = Extent{Chunk: int(x.chunk), Offset: int64(x.off), Length: int64(x.length)}
				f.Size += int64(x.length)
			}
		}
	case kindSymlink:
		f.Target = e.targets[i]
	}
	return f
}

func (e *entries) extents(i int) []extent {
	start := uint32(0)
	if i > 0 {
		start = e.extEnd[i-1]
	}
	return e.ext[start:e.extEnd[i]]
}

// isDir reports whether p is a directory among the entries so far (which
// are sorted).
func (e *entries) isDir(p string) bool {
	n := e.len()
	i := sort.Search(n, func(i int) bool { return e.path(i) >= p })
	return i < n && e.path(i) == p && e.meta[i]>>16 == kindDir
}

// Len returns the number of entries of the index.
func (x *Index) Len() int {
	if x.ent != nil && x.Files == nil {
		return x.ent.len()
	}
	return len(x.Files)
}

// File returns entry i.
func (x *Index) File(i int) File {
	if x.ent != nil && x.Files == nil {
		return x.ent.file(i)
	}
	return x.Files[i]
}

// Path returns the path of entry i.
func (x *Index) Path(i int) string {
	if x.ent != nil && x.Files == nil {
		return x.ent.path(i)
	}
	return x.Files[i].Path
}

// Kind returns the type of entry i: TypeFile, TypeDir or TypeSymlink.
func (x *Index) Kind(i int) string {
	if x.ent != nil && x.Files == nil {
		return kindNames[x.ent.meta[i]>>16]
	}
	return x.Files[i].Type
}

// Find returns the entry at path p.
func (x *Index) Find(p string) (int, bool) {
	n := x.Len()
	i := sort.Search(n, func(i int) bool { return x.Path(i) >= p })
	return i, i < n && x.Path(i) == p
}

// AllFiles returns every entry as a File: the index in its expanded form,
// which costs several times the memory of an opened index.
func (x *Index) AllFiles() []File {
	if x.ent == nil || x.Files != nil {
		return x.Files
	}
	out := make([]File, x.Len())
	for i := range out {
		out[i] = x.File(i)
	}
	return out
}

// compact moves the entries and the chunks of x into their compact form
// (an empty chunk table stays as it is), without the chunks' edge digests
// when skipEdges, and lets go of what only reading the index needed.
func (x *Index) compact(skipEdges bool) error {
	if x.ch == nil && len(x.Chunks) > 0 {
		t := newChunkTable(skipEdges)
		for _, c := range x.Chunks {
			if err := t.add(c); err != nil {
				return err
			}
		}
		x.ch, x.Chunks = t, nil
	}
	if x.ch != nil {
		x.ch.find = chunkSet{}
		if x.ch.skipEdges {
			x.ch.edges = nil // only a second listing of a chunk needed them
		}
	}
	if x.ent != nil {
		return nil
	}
	e := newEntries(len(x.Files))
	for i := range x.Files {
		if err := e.add(&x.Files[i]); err != nil {
			return err
		}
	}
	x.ent, x.Files = e, nil
	return nil
}

func (e *entries) String() string { return fmt.Sprintf("%d entries", e.len()) }

// Size returns the size of entry i: the sum of its extents.
func (x *Index) Size(i int) int64 {
	if x.ent != nil && x.Files == nil {
		var n int64
		for _, e := range x.ent.extents(i) {
			n += int64(e.length)
		}
		return n
	}
	return x.Files[i].Size
}

// fileRef returns a copy of entry i to pass by pointer.
func (x *Index) fileRef(i int) *File {
	f := x.File(i)
	return &f
}

// NumExtents returns the number of extents of entry i.
func (x *Index) NumExtents(i int) int {
	if x.ent != nil && x.Files == nil {
		return len(x.ent.extents(i))
	}
	return len(x.Files[i].Extents)
}

// Extent returns extent k of entry i, without expanding the entry.
func (x *Index) Extent(i, k int) Extent {
	if x.ent != nil && x.Files == nil {
		e := x.ent.extents(i)[k]
		return Extent{Chunk: int(e.chunk), Offset: int64(e.off), Length: int64(e.length)}
	}
	return x.Files[i].Extents[k]
}
