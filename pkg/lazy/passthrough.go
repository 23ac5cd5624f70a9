package lazy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Warm reads through FUSE passthrough. When every chunk of a file is in the
// chunk cache, the volume assembles the file's bytes once into a backing
// file of the cache (chunkcache.Assemble: verified against the file's
// digest, counted in the cache's bound): when such a file is opened and no
// FUSE handle of it is open, before the open is answered (so the first open
// after a mount is served by passthrough too), and otherwise in the
// background once its last FUSE handle is closed. An open of a file that
// has one is answered with the backing file's descriptor, and the kernel then serves
// reads and mmap of it straight from that file, with no request to this
// process. The kernel does not let one inode be open both ways at once, so
// a file open through FUSE (its backing file not yet made) gets its next
// opens through FUSE too until all are closed. Where the kernel does not
// grant passthrough (before Linux 6.9, not root, or a backing file on a
// file system it cannot stack on) go-fuse stops offering it and every read
// goes through FUSE as before.

// XattrFUSEReads names the extended attribute of a regular file that holds
// how many FUSE READ requests this mount has served for it while the
// kernel held its inode, and of the mount's root that holds how many it
// has served for all its files (debug counters: they stay put for reads
// served by passthrough).
const XattrFUSEReads = "user.bdnvol.fuse-reads"

// openState is what a file node tracks of its opens.
type openState struct {
	mu        sync.Mutex
	fuseOpens int                 // handles served through FUSE
	passOpens int                 // handles offered the backing file
	back      *chunkcache.Backing // open while passOpens > 0
}

// passHandle is an open file offered to the kernel for passthrough. If
// go-fuse cannot register it, reads of it come through FUSE as usual.
type passHandle struct{ n *fileNode }

var (
	_ = (fs.FilePassthroughFder)((*passHandle)(nil))
	_ = (fs.FileReleaser)((*passHandle)(nil))
	_ = (fs.FileReleaser)((*fuseHandle)(nil))
)

// PassthroughFd returns the backing file's descriptor.
func (h *passHandle) PassthroughFd() (int, bool) {
	h.n.open.mu.Lock()
	defer h.n.open.mu.Unlock()
	if h.n.open.back == nil {
		return 0, false
	}
	return int(h.n.open.back.File().Fd()), true
}

// Release closes the backing file with the last handle that uses it.
func (h *passHandle) Release(ctx context.Context) syscall.Errno {
	o := &h.n.open
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.passOpens--; o.passOpens == 0 && o.back != nil {
		o.back.Close()
		o.back = nil
	}
	return fs.OK
}

// fuseHandle is an open file served through FUSE.
type fuseHandle struct{ n *fileNode }

// Release makes the file's backing file, once no handle serves it
// through FUSE, if all its chunks are cached by then.
func (h *fuseHandle) Release(ctx context.Context) syscall.Errno {
	o := &h.n.open
	o.mu.Lock()
	o.fuseOpens--
	last := o.fuseOpens == 0
	if last {
		h.n.t.closed(h.n)
	}
	o.mu.Unlock()
	if last && h.n.t.pass.Load() {
		h.n.t.v.assembleAsync(h.n.idx)
	}
	return fs.OK
}

// openHandle returns the handle for a new open of n and its open flags:
// when no FUSE handle is open, the backing file, made now if the file's
// chunks are all cached and it has none yet; else a FUSE handle (and the
// backing file is made in the background when the file's chunks are all
// cached).
func (n *fileNode) openHandle() (fs.FileHandle, uint32) {
	o := &n.open
	o.mu.Lock()
	defer o.mu.Unlock()
	if n.t.pass.Load() && o.fuseOpens == 0 {
		if o.back == nil {
			o.back = n.t.v.openBacking(n.idx)
		}
		if o.back == nil {
			o.back = n.t.v.assembleNow(n.idx)
		}
		if o.back != nil {
			o.passOpens++
			return &passHandle{n: n}, 0
		}
	}
	o.fuseOpens++
	if o.fuseOpens == 1 {
		n.t.opened(n)
		if n.t.pass.Load() {
			n.t.v.assembleAsync(n.idx)
		}
	}
	return &fuseHandle{n: n}, fuse.FOPEN_KEEP_CACHE
}

// Getxattr serves XattrFUSEReads.
func (n *fileNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr != XattrFUSEReads {
		return 0, fs.ENOATTR
	}
	val := strconv.FormatInt(n.reads.Load(), 10)
	if len(dest) < len(val) {
		return uint32(len(val)), syscall.ERANGE
	}
	return uint32(copy(dest, val)), fs.OK
}

// fileDesc returns the descriptor (SHA-256 and size) of regular file i,
// and whether it has one a backing file can be made for.
func (v *Volume) fileDesc(i int) (ocispec.Descriptor, bool) { return backingDesc(v.ver, i) }

// backingDesc returns the descriptor (SHA-256 and size) of regular file i
// of ver, and whether a mount serves it by passthrough (so that it gets a
// backing file).
func backingDesc(ver *layout.Version, i int) (ocispec.Descriptor, bool) {
	e := ver.Index.File(i)
	d := ocispec.Descriptor{Digest: e.Digest, Size: e.Size}
	return d, e.Type == layout.TypeFile && e.Size >= passthroughMin && e.Digest.Validate() == nil && e.Digest.Algorithm() == "sha256"
}

// passthroughMin is the size of the smallest file served by passthrough.
// Below it a backing file costs more than the FUSE reads it saves (a file
// made, hashed and opened, where FUSE answers one read, then the page
// cache), and a tree of many small files would get one each: an open of
// each of 10^5 cached 1 KiB files waited for its own backing file.
var passthroughMin int64 = 64 << 10

// openBacking returns the cache's backing file of file i, or nil.
func (v *Volume) openBacking(i int) *chunkcache.Backing {
	d, ok := v.fileDesc(i)
	if !ok {
		return nil
	}
	b, _ := v.opt.Cache.OpenBacking(d)
	return b
}

// assembleAsync makes the backing file of file i in the background, if
// every chunk of the file is cached and none is being made.
func (v *Volume) assembleAsync(i int) {
	d, ok := v.fileDesc(i)
	if !ok {
		return
	}
	if !v.allCached(i) || !v.startAssembly(i) {
		return
	}
	go func() {
		defer v.endAssembly(i)
		if !v.waitQuiet() {
			return
		}
		// Reads hold it back for assemblyMaxWait at most; past that it
		// copies and hashes the whole file beside them, so only on CPU
		// time nothing else wants (a cold start's loader keeps reading
		// for longer than that on a large model).
		_ = idleThread()
		onBackgroundAssembly()
		b, err := v.assemble(v.bg, i, d)
		if err == nil {
			b.Close() // on disk now; the next open finds it
		}
	}()
}

// waitQuiet waits until the volume has fetched nothing, served no FUSE
// read and had no file open through FUSE for assemblyQuiet, so that a
// backing file made in the background (which reads, writes and hashes the
// whole file again) does not take the CPU and disk that reads need: a cold
// `cat` of every file, or a loader in a cold start, would otherwise wait
// while the files it read are copied. Reads and open files hold it back
// for assemblyMaxWait at most, fetches for as long as they go on. It
// returns false if the volume closes first.
func (v *Volume) waitQuiet() bool {
	const ticks = 4
	t := time.NewTicker(assemblyQuiet / ticks)
	defer t.Stop()
	start := time.Now()
	seenF, seenR, quiet := v.fetches.Load(), v.reads.Load(), 0
	for quiet < ticks {
		select {
		case <-v.bg.Done():
			return false
		case <-t.C:
		}
		f, r := v.fetches.Load(), v.reads.Load()
		// Reads hold it back for assemblyMaxWait at most: a file read
		// without pause still gets its backing file. So does a file open
		// through FUSE, whose reader may be reading the page cache (the
		// replay's fill), where no read reaches this process.
		readsQuiet := (r == seenR && v.openFiles() == 0) || time.Since(start) >= assemblyMaxWait
		if f == seenF && readsQuiet && v.fetching.Load() == 0 {
			quiet++
		} else {
			quiet = 0
		}
		seenF, seenR = f, r
	}
	return true
}

// onBackgroundAssembly is called as a backing file starts being made in
// the background, on its thread (tests).
var onBackgroundAssembly = func() {}

// assemblyQuiet is how long a volume must fetch nothing and serve no read
// before a backing file is made in the background.
var assemblyQuiet = 200 * time.Millisecond

// assemblyMaxWait is how long reads (not fetches) can hold back a backing
// file made in the background.
var assemblyMaxWait = 5 * time.Second

// assembleNow makes the backing file of file i and returns it open, if
// every chunk of the file is cached and none is being made; else nil. It
// is what lets the first open of a warm file after a mount be served by
// passthrough: the open waits while the file's cached chunks are copied
// (and hashed) into it.
func (v *Volume) assembleNow(i int) *chunkcache.Backing {
	d, ok := v.fileDesc(i)
	if !ok || v.coldStart() || !v.allCached(i) || !v.startAssembly(i) {
		// While the volume fetches, or once it has fetched (a cold
		// start, a profile replayed), the open is served through FUSE
		// at once rather than made to wait for a copy of the file,
		// which is made once the volume is quiet (assembleAsync). A
		// warm mount, which fetches nothing, makes it here.
		return nil
	}
	defer v.endAssembly(i)
	b, err := v.assemble(v.bg, i, d)
	if err != nil {
		return nil
	}
	return b
}

// allCached reports whether every chunk of file i is in the cache.
func (v *Volume) allCached(i int) bool {
	for _, x := range v.ver.Index.File(i).Extents {
		if !v.opt.Cache.Contains(v.ver.Chunk(x.Chunk).Digest) {
			return false
		}
	}
	return true
}

// startAssembly marks file i as being assembled, unless it already is or
// the volume is closing; endAssembly undoes it.
func (v *Volume) startAssembly(i int) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.assembling[i] || v.bg.Err() != nil {
		return false
	}
	v.assembling[i] = true
	v.wg.Add(1)
	return true
}

func (v *Volume) endAssembly(i int) {
	v.mu.Lock()
	delete(v.assembling, i)
	v.mu.Unlock()
	v.wg.Done()
}

// errNotCached is the fetcher's answer while a backing file is assembled:
// it is made only from chunks already cached.
var errNotCached = errors.New("chunk no longer cached")

type cachedOnly struct{}

func (cachedOnly) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return nil, errNotCached
}

// assemblyWrite is the size of the writes that fill a backing file: 2 MiB,
// the largest folio the page cache makes on x86-64 and arm64 (4 KiB pages),
// which a mapping maps with one fault.
const assemblyWrite = 2 << 20

// assemble makes the backing file of file i (descriptor d) from its
// cached chunks.
func (v *Volume) assemble(ctx context.Context, i int, d ocispec.Descriptor) (*chunkcache.Backing, error) {
	return assembleFile(ctx, v.opt.Cache, v.ver, i, d)
}

// BuildBacking makes, from the chunks cache holds (for its view's origin),
// the backing file a mount serves file i of ver from by passthrough, so
// that no open of the file has to wait while it is made: what warming
// does once a version's chunks are cached. Then it folds the chunks that
// lie whole in the backing file into it (chunkcache.Fold), so that the
// file's bytes take the disk once. It reports whether the file has a
// backing file now (made or found). A file a mount does not serve by
// passthrough (small, or not a regular file), one whose chunks are not all
// cached, and one that does not fit in the cache's bound get none, and no
// error; bytes that do not verify are an error.
func BuildBacking(ctx context.Context, cache *chunkcache.Cache, ver *layout.Version, i int) (bool, error) {
	d, ok := backingDesc(ver, i)
	if !ok {
		return false, nil
	}
	b, err := cache.OpenBacking(d)
	if err != nil {
		return false, err
	}
	if b == nil {
		for _, x := range ver.Index.File(i).Extents {
			if !cache.Contains(ver.Chunk(x.Chunk).Digest) {
				return false, nil
			}
		}
		b, err = assembleFile(ctx, cache, ver, i, d)
		switch {
		case errors.Is(err, chunkcache.ErrNoRoom), errors.Is(err, chunkcache.ErrBusy), errors.Is(err, errNotCached):
			return false, nil
		case err != nil:
			return false, err
		}
	}
	defer b.Close()
	if _, err := cache.Fold(d, wholePieces(ver, i)); err != nil {
		return true, err
	}
	return true, nil
}

// wholePieces returns the chunks of file i of ver that lie whole in it,
// with where.
func wholePieces(ver *layout.Version, i int) []chunkcache.Piece {
	var ps []chunkcache.Piece
	var off int64
	for _, x := range ver.Index.File(i).Extents {
		c := ver.Chunk(x.Chunk)
		if x.Offset == 0 && x.Length == c.Size {
			ps = append(ps, chunkcache.Piece{Chunk: c, FileOffset: off})
		}
		off += x.Length
	}
	return ps
}

// assembleFile makes the backing file of file i of ver (descriptor d) from
// the chunks cache holds.
func assembleFile(ctx context.Context, cache *chunkcache.Cache, ver *layout.Version, i int, d ocispec.Descriptor) (*chunkcache.Backing, error) {
	e := ver.Index.File(i)
	buf := make([]byte, min(1<<20, max(e.Size, 1)))
	return cache.Assemble(ctx, d, func(out io.Writer) error {
		// Whole, aligned writes of assemblyWrite bytes: the kernel then
		// caches the file in large folios, which a mapping maps with few
		// faults. Measured on a 419 MB shard, loaded by bench/loader -mode
		// mmap right after it was written: 1 MiB writes at unaligned
		// offsets (the chunks' own) 2,294 faults and 70-190 ms; 2 MiB
		// aligned writes 1,463-1,508 faults and 10-24 ms; the same file
		// read back from disk 600 faults and 4 ms.
		w := bufio.NewWriterSize(out, int(min(int64(assemblyWrite), max(e.Size, 1))))
		for _, x := range e.Extents {
			if err := ctx.Err(); err != nil {
				return err
			}
			ch, err := cache.Load(ctx, cachedOnly{}, ver.Chunk(x.Chunk))
			if err != nil {
				return err
			}
			_, err = io.CopyBuffer(w, io.NewSectionReader(ch, x.Offset, x.Length), buf)
			ch.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", e.Path, err)
			}
		}
		return w.Flush()
	})
}
