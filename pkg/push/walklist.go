package push

import (
	"math"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// The kinds of entries a walkList holds, in its meta.
const (
	kindFile = iota
	kindDir
	kindSymlink
)

var kindNames = [...]string{kindFile: layout.TypeFile, kindDir: layout.TypeDir, kindSymlink: layout.TypeSymlink}

// walkList is a walk held compactly, as a push keeps it while it runs: one
// string for all paths and fixed-size fields in flat arrays, about 45 bytes
// plus the path per entry against about 130 for an []Entry. Entries are in
// path order.
type walkList struct {
	arena   string
	end     []uint32 // end of path i in arena
	meta    []uint32 // kind<<16 | mode
	size    []int64
	mtime   []int64
	ctime   []int64
	ino     []uint64
	targets map[int]string        // symlink targets by entry
	digests map[int]digest.Digest // digests the source states, by entry
	// statSize holds the stat key's size where it is not the entry's (a
	// directory's).
	statSize map[int]int64
}

// walkBuilder appends entries to a walkList in any order.
type walkBuilder struct {
	arena strings.Builder
	w     walkList
}

func (b *walkBuilder) add(e *Entry) error {
	if uint64(b.arena.Len())+uint64(len(e.Path)) > math.MaxUint32 {
		return layout.Invalid("walk too large to hold (at %q)", e.Path)
	}
	i := len(b.w.end)
	b.arena.WriteString(e.Path)
	b.w.end = append(b.w.end, uint32(b.arena.Len()))
	var kind uint32
	switch e.Type {
	case layout.TypeFile:
		kind = kindFile
	case layout.TypeDir:
		kind = kindDir
	case layout.TypeSymlink:
		kind = kindSymlink
	default:
		return layout.Invalid("%q: unknown type %q", e.Path, e.Type)
	}
	if e.Mode > 0xffff {
		return layout.Invalid("%q: mode %o", e.Path, e.Mode)
	}
	b.w.meta = append(b.w.meta, kind<<16|e.Mode)
	b.w.size = append(b.w.size, e.Size)
	b.w.mtime = append(b.w.mtime, e.Stat.Mtime)
	b.w.ctime = append(b.w.ctime, e.Stat.Ctime)
	b.w.ino = append(b.w.ino, e.Stat.Ino)
	if e.Stat.Size != e.Size {
		if b.w.statSize == nil {
			b.w.statSize = map[int]int64{}
		}
		b.w.statSize[i] = e.Stat.Size
	}
	if e.Target != "" {
		if b.w.targets == nil {
			b.w.targets = map[int]string{}
		}
		b.w.targets[i] = e.Target
	}
	if e.Digest != "" {
		if b.w.digests == nil {
			b.w.digests = map[int]digest.Digest{}
		}
		b.w.digests[i] = e.Digest
	}
	return nil
}

// list returns the entries added, sorted by path.
func (b *walkBuilder) list() *walkList {
	w := &b.w
	w.arena = b.arena.String()
	n := len(w.end)
	sorted := true
	for i := 1; i < n && sorted; i++ {
		sorted = w.path(i-1) < w.path(i)
	}
	if sorted {
		return w
	}
	perm := make([]uint32, n)
	for i := range perm {
		perm[i] = uint32(i)
	}
	slices.SortStableFunc(perm, func(a, b uint32) int { return strings.Compare(w.path(int(a)), w.path(int(b))) })
	var out walkBuilder
	out.arena.Grow(len(w.arena))
	out.w = walkList{end: make([]uint32, 0, n), meta: make([]uint32, 0, n), size: make([]int64, 0, n),
		mtime: make([]int64, 0, n), ctime: make([]int64, 0, n), ino: make([]uint64, 0, n)}
	for _, k := range perm {
		e := w.at(int(k))
		_ = out.add(&e) // each entry was added once already
	}
	return out.list()
}

// newWalkList holds es (sorted by path, as a Source walks) compactly.
func newWalkList(es []Entry) (*walkList, error) {
	var b walkBuilder
	for i := range es {
		if err := b.add(&es[i]); err != nil {
			return nil, err
		}
	}
	return b.list(), nil
}

func (w *walkList) len() int { return len(w.end) }

func (w *walkList) path(i int) string {
	start := uint32(0)
	if i > 0 {
		start = w.end[i-1]
	}
	return w.arena[start:w.end[i]]
}

// at returns entry i; its path is a part of the list's, not a copy.
func (w *walkList) at(i int) Entry {
	m := w.meta[i]
	e := Entry{Path: w.path(i), Type: kindNames[m>>16], Mode: m & 0xffff, Size: w.size[i],
		Stat: statcache.Key{Size: w.size[i], Mtime: w.mtime[i], Ctime: w.ctime[i], Ino: w.ino[i]}}
	if len(w.statSize) > 0 {
		if n, ok := w.statSize[i]; ok {
			e.Stat.Size = n
		}
	}
	if len(w.targets) > 0 {
		e.Target = w.targets[i]
	}
	if len(w.digests) > 0 {
		e.Digest = w.digests[i]
	}
	return e
}

// find returns the number of the entry at path p, or -1.
func (w *walkList) find(p string) int {
	lo, hi := 0, w.len()
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if w.path(m) < p {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < w.len() && w.path(lo) == p {
		return lo
	}
	return -1
}

// kind returns the type of entry i.
func (w *walkList) kind(i int) string { return kindNames[w.meta[i]>>16] }

// entries returns the list as Entries.
func (w *walkList) entries() []Entry {
	out := make([]Entry, w.len())
	for i := range out {
		out[i] = w.at(i)
	}
	return out
}
