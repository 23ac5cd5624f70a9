package lazy

import (
	"context"
	"sort"
	"sync"
)

// A cold start replaying a startup profile (LoadChunks) fetches the
// chunks a loader is about to read well before it reads them: the loader,
// not the link, is what such a start waits for, each of its reads costing
// a FUSE round trip per 128 KiB while the replay, and on a small node the
// registry's traffic, hold the CPUs. So each chunk the replay loads is
// also stored in the kernel's page cache of every open file that holds
// it (FUSE's NOTIFY_STORE), and a file opened after the replay loaded
// some of its chunks gets those at its first open: the loader's reads of
// them are page-cache hits, served without a request. The bytes stored
// are the cache's, verified like any read's. Only whole pages go in (the
// page a chunk shares with the next is left to a read), never past the
// file's end, and only for files open through FUSE (the kernel holds
// their inodes; node IDs are never reused within a mount).

// storePiece is how many bytes one store request carries.
const storePiece = 1 << 20

// replayState is what the page-cache fill knows of a volume's replay.
type replayState struct {
	mu     sync.Mutex
	loaded map[int]bool      // chunks the replay loaded
	open   map[int]*fileNode // files with a FUSE handle open, by index
	store  func(k int)       // set by a mount: store chunk k in open files
}

// replayLoaded records that the replay loaded chunk k, and stores it in
// the files open through a mount of v.
func (v *Volume) replayLoaded(k int) {
	r := &v.replay
	r.mu.Lock()
	if r.loaded == nil {
		r.loaded = make(map[int]bool)
	}
	r.loaded[k] = true
	store := r.store
	r.mu.Unlock()
	if store != nil {
		store(k)
	}
}

// opened notes a file's first FUSE handle and stores in its page cache
// the chunks the replay has loaded (in the background).
func (t *tree) opened(n *fileNode) {
	r := &t.v.replay
	r.mu.Lock()
	if r.open == nil {
		r.open = make(map[int]*fileNode)
	}
	r.open[n.idx] = n
	some := len(r.loaded) > 0
	r.mu.Unlock()
	if some {
		t.v.Go(func(ctx context.Context) { t.storeChunks(ctx, n, t.v.replayHas) })
	}
}

// replayHas reports whether the replay loaded chunk k.
func (v *Volume) replayHas(k int) bool {
	v.replay.mu.Lock()
	defer v.replay.mu.Unlock()
	return v.replay.loaded[k]
}

// openFiles returns how many files of v have a FUSE handle open.
func (v *Volume) openFiles() int {
	v.replay.mu.Lock()
	defer v.replay.mu.Unlock()
	return len(v.replay.open)
}

// closed notes that a file's last FUSE handle was released.
func (t *tree) closed(n *fileNode) {
	r := &t.v.replay
	r.mu.Lock()
	if r.open[n.idx] == n {
		delete(r.open, n.idx)
	}
	r.mu.Unlock()
}

// storeLoaded stores chunk k in the page cache of each open file that
// holds it.
func (t *tree) storeLoaded(k int) {
	r := &t.v.replay
	r.mu.Lock()
	nodes := make([]*fileNode, 0, len(r.open))
	for _, n := range r.open {
		nodes = append(nodes, n)
	}
	r.mu.Unlock()
	for _, n := range nodes {
		t.storeChunks(t.v.bg, n, func(c int) bool { return c == k })
	}
}

// storeChunks stores in n's page cache the pages of its extents whose
// chunks ks reports: the pages an extent shares with its neighbours too
// when the cache holds those, else only the pages it covers whole. The
// bytes are the cache's, verified like any read's; nothing is fetched.
func (t *tree) storeChunks(ctx context.Context, n *fileNode, ks func(k int) bool) {
	f, err := n.file()
	if err != nil {
		return
	}
	size := f.e.Size
	for i, x := range f.e.Extents {
		if ctx.Err() != nil || !ks(x.Chunk) {
			continue
		}
		at, end := f.starts[i], f.starts[i]+x.Length
		lo, hi := at/pageSize*pageSize, min(size, (end+pageSize-1)/pageSize*pageSize)
		if lo < at && !f.cachedRange(lo, at) {
			lo += pageSize // its first page is another chunk's too
		}
		if hi > end && !f.cachedRange(end, hi) {
			hi = end / pageSize * pageSize // and its last
		}
		if lo >= hi {
			continue
		}
		if err := t.storeRange(ctx, n, f, lo, hi-lo); err != nil {
			return // the kernel no longer holds the file, or refuses stores
		}
	}
}

// cachedRange reports whether the cache holds every chunk of f's bytes
// [from, to).
func (f *File) cachedRange(from, to int64) bool {
	k := sort.Search(len(f.starts), func(k int) bool { return f.starts[k] > from }) - 1
	for ; k >= 0 && k < len(f.starts) && f.starts[k] < to; k++ {
		if !f.v.opt.Cache.Contains(f.v.ver.Chunk(f.e.Extents[k].Chunk).Digest) {
			return false
		}
	}
	return k >= 0
}

// storeBufs holds the buffers storeRange reads a file's bytes into.
var storeBufs = sync.Pool{New: func() any { return new([storePiece]byte) }}

// storeRange stores f's bytes [off, off+n) in node's page cache, a piece
// at a time, read from chunks the cache holds.
func (t *tree) storeRange(ctx context.Context, node *fileNode, f *File, off, n int64) error {
	if !f.cachedRange(off, off+n) {
		return nil
	}
	b := storeBufs.Get().(*[storePiece]byte)
	defer storeBufs.Put(b)
	for done := int64(0); done < n; {
		m := min(int64(storePiece), n-done)
		first := sort.Search(len(f.starts), func(k int) bool { return f.starts[k] > off+done }) - 1
		if _, err := f.copyOut(ctx, b[:m], off+done, first); err != nil {
			return err
		}
		if errno := node.WriteCache(off+done, b[:m]); errno != 0 {
			return errno
		}
		t.v.stored.Add(m)
		done += m
	}
	return nil
}
