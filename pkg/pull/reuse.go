package pull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// localChunk is where a chunk may already be in the destination: the bytes
// at off in the file at path. It serves them as a fetcher would; the
// caller verifies them against the chunk's digest.
type localChunk struct {
	d    *destDir
	path string
	off  int64
	// vouched is the stat key an earlier pull recorded for the file at
	// path after writing it from verified chunks: while the file still has
	// it, its bytes are those chunks and are copied without hashing them.
	vouched *statcache.Key
}

// Fetch opens the file, never following a symlink, and returns the chunk's
// range of it.
func (l localChunk) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	pfd, err := l.d.openDir(parentOf(l.path))
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, path.Base(l.path), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: l.d.full(l.path), Err: err}
	}
	fh := os.NewFile(uintptr(fd), l.d.full(l.path))
	info, err := fh.Stat()
	if err != nil || !info.Mode().IsRegular() || info.Size() < l.off+desc.Size {
		fh.Close()
		return nil, fmt.Errorf("%s: no chunk %s at %d", l.d.full(l.path), desc.Digest, l.off)
	}
	if holeIn(fh, l.off, desc.Size) {
		// Never written there: not worth reading (the chunk is fetched).
		fh.Close()
		return nil, fmt.Errorf("%s: no chunk %s at %d: a hole", l.d.full(l.path), desc.Digest, l.off)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(fh, l.off, desc.Size), fh}, nil
}

// errNotVouched is a local chunk whose file changed since the pull that
// recorded it, or that cannot be copied in the kernel: it is copied the
// hashed way instead.
var errNotVouched = errors.New("not vouched for by the pull record")

// copyVouched copies the chunk desc from a file an earlier pull wrote and
// recorded (l.vouched) to its targets, in the kernel and without hashing:
// the file's stat key, unchanged since that pull verified and wrote it,
// before and after the copy, stands for its bytes. Any doubt returns
// errNotVouched (nothing final was touched: targets are temporaries).
func (l localChunk) copyVouched(ctx context.Context, desc ocispec.Descriptor, ts []target, files *pullSet, c *progress.Counters, credited *int64) error {
	if l.vouched == nil {
		return errNotVouched
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	pfd, err := l.d.openDir(parentOf(l.path))
	if err != nil {
		return errNotVouched
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, path.Base(l.path), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return errNotVouched
	}
	src := os.NewFile(uintptr(fd), l.d.full(l.path))
	defer src.Close()
	same := func() bool {
		info, err := src.Stat()
		return err == nil && info.Mode().IsRegular() && statcache.KeyOf(info) == *l.vouched && info.Size() >= l.off+desc.Size
	}
	if !same() {
		return errNotVouched
	}
	open := &openFiles{files: files}
	defer open.close()
	var written int64
	for _, t := range ts {
		if err := ctx.Err(); err != nil {
			return err
		}
		dst, err := open.get(t.file)
		if err != nil {
			return writeError{err}
		}
		if err := copyLocked(files.at(t.file).writing(), dst, t.fileOff, src, l.off+t.chunkOff, t.n); err != nil {
			if errors.Is(err, errors.ErrUnsupported) {
				return errNotVouched
			}
			return writeError{err}
		}
		if t.chunkOff+t.n > *credited {
			written += t.chunkOff + t.n - max(t.chunkOff, *credited)
		}
	}
	if !same() {
		return errNotVouched // changed while we copied: hash it instead
	}
	if err := open.close(); err != nil {
		return writeError{err}
	}
	*credited = max(*credited, desc.Size)
	c.Processed.Add(written)
	return nil
}

// copyStep is the most copyLocked copies while it holds a file's write
// lock, so that writers of fetched bytes into the same file do not wait
// for a whole chunk.
const copyStep = 4 << 20

// copyLocked is copyRange in steps of copyStep, each with mu held.
func copyLocked(mu *sync.Mutex, dst *os.File, dstOff int64, src *os.File, srcOff, n int64) error {
	for done := int64(0); done < n; {
		// Steps end on multiples of copyStep in dst, so that all but the
		// first start block-aligned where copyRange can clone blocks.
		k := min(n-done, copyStep-(dstOff+done)%copyStep)
		mu.Lock()
		err := copyRange(dst, dstOff+done, src, srcOff+done, k)
		mu.Unlock()
		if err != nil {
			return err
		}
		done += k
	}
	return nil
}

// localChunks finds, for the chunks still needed (byChunk), where their
// bytes may already be in the destination: where an earlier pull wrote them
// (previous records it), else at the same place in a file already at the
// final name of a file being written (an in-place fine-tune keeps most
// tensors where they were). Every candidate is verified when copied.
func (d *destDir) localChunks(ctx context.Context, x *layout.Index, byChunk [][]slot, files *pullSet, previous *statcache.PulledRecords) (map[int]localChunk, error) {
	needed := map[digest.Digest]int{}
	for k, ts := range byChunk {
		if len(ts) > 0 {
			needed[x.ChunkDigest(k)] = k
		}
	}
	out := map[int]localChunk{}
	if len(needed) == 0 {
		return out, nil
	}
	previous.Each(func(p string, rec statcache.Record) bool {
		var off int64
		var vouched *statcache.Key
		if !rec.Racy {
			vouched = &rec.Stat
		}
		for _, e := range rec.Extents {
			if k, ok := needed[e.Digest]; ok && e.Digest != "" {
				if _, found := out[k]; !found {
					out[k] = localChunk{d, p, off, vouched}
				}
			}
			off += e.Length
		}
		return ctx.Err() == nil
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i := range x.Len() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !files.active(i) {
			continue
		}
		f := fileAt(x, i)
		rec, recorded := previous.Get(f.Path)
		if !recorded && wantsWholeChunk(f, x, byChunk, out) {
			// No record of what is there: cut it as a push would and
			// look for the chunks still needed.
			d.scanChunks(ctx, f.Path, x.Chunking, needed, out)
		}
		if recorded && sharesChunks(rec, f, x) && d.holdsRecord(f.Path, rec) {
			// An earlier pull wrote this file and it is still as written:
			// it holds exactly the chunks its record lists, and those it
			// shares with the new version were offered above. Cuts fall
			// at the same places over the same bytes, so the new version's
			// other chunks there are bytes that changed (a tensor a
			// fine-tune rewrote): looking for them at the same place would
			// only hash bytes that differ.
			continue
		}
		var off int64
		var size int64 = -1 // of the file at the final name, once looked at
		for _, e := range f.Extents {
			csize := x.ChunkSize(e.Chunk)
			start := off
			off += e.Length
			if _, found := out[e.Chunk]; found || len(byChunk[e.Chunk]) == 0 || e.Offset != 0 || e.Length != csize {
				continue
			}
			if size < 0 {
				size = d.regularSize(f.Path)
			}
			if start+csize <= size {
				out[e.Chunk] = localChunk{d: d, path: f.Path, off: start}
			}
		}
	}
	return out, ctx.Err()
}

// sharesChunks reports whether the recorded file rec holds at least one
// chunk of f: then both were cut with the same parameters.
func sharesChunks(rec statcache.Record, f *layout.File, x *layout.Index) bool {
	if len(rec.Extents) == 0 {
		return false
	}
	had := make(map[digest.Digest]bool, len(rec.Extents))
	for _, e := range rec.Extents {
		had[e.Digest] = true
	}
	for _, e := range f.Extents {
		if had[x.ChunkDigest(e.Chunk)] {
			return true
		}
	}
	return false
}

// holdsRecord reports whether the file at rel is still as the earlier pull
// that recorded rec left it: a record not marked racy, with the stat key
// the file has now.
func (d *destDir) holdsRecord(rel string, rec statcache.Record) bool {
	if rec.Racy {
		return false
	}
	k, ok := d.statKey(rel)
	return ok && k == rec.Stat
}

// wantsWholeChunk reports whether f has an extent that is a whole chunk
// still needed and not yet found.
func wantsWholeChunk(f *layout.File, x *layout.Index, byChunk [][]slot, found map[int]localChunk) bool {
	for _, e := range f.Extents {
		if _, ok := found[e.Chunk]; !ok && len(byChunk[e.Chunk]) > 0 && e.Offset == 0 && e.Length == x.ChunkSize(e.Chunk) {
			return true
		}
	}
	return false
}

// scanChunks cuts the regular file rel into chunks with the parameters p,
// the way a push does, and records in out where it holds chunks of needed.
func (dd *destDir) scanChunks(ctx context.Context, rel string, p layout.Params, needed map[digest.Digest]int, out map[int]localChunk) {
	if p.Validate() != nil {
		return
	}
	pfd, err := dd.openDir(parentOf(rel))
	if err != nil {
		return
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, path.Base(rel), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	fh := os.NewFile(uintptr(fd), dd.full(rel))
	defer fh.Close()
	info, err := fh.Stat()
	if err != nil || !info.Mode().IsRegular() || info.Size() == 0 {
		return
	}
	size := info.Size()
	if holeIn(fh, 0, size) {
		// Not a file a pull wrote (it writes every byte), and cutting it
		// would read its declared size, holes as zeros: not scanned.
		return
	}
	layout.CutFile(ctx, fh, rel, size, p, func(off int64, d digest.Digest) {
		if k, ok := needed[d]; ok {
			if _, found := out[k]; !found {
				out[k] = localChunk{d: dd, path: rel, off: off}
			}
		}
	})
}

// regularSize returns the size of the regular file rel, or 0 when there is
// none (or something else) there.
func (d *destDir) regularSize(rel string) int64 {
	pfd, err := d.openDir(parentOf(rel))
	if err != nil {
		return 0
	}
	defer unix.Close(pfd)
	st, ok, err := lstatAt(pfd, path.Base(rel))
	if err != nil || !ok || !isRegular(&st) {
		return 0
	}
	return st.Size
}

// removeStale removes the files an earlier pull wrote (previous) that the
// version x does not have, if they are as that pull left them. Files
// someone changed since, or that no pull wrote, stay, and so do those
// outside the selection (sel, nil for all). It returns how many it removed.
func (d *destDir) removeStale(x *layout.Index, previous *statcache.PulledRecords, sel func(string) bool) int {
	n := 0
	previous.Each(func(p string, c statcache.Record) bool {
		if _, have := x.Find(p); have || (sel != nil && !sel(p)) { // PulledFiles left out paths no index could hold
			return true
		}
		n += d.removeIfUnchanged(p, c.Stat)
		return true
	})
	return n
}

// removeIfUnchanged removes the regular file p if its stat key is still k;
// it returns 1 if it did.
func (d *destDir) removeIfUnchanged(p string, k statcache.Key) int {
	pfd, err := d.openDir(parentOf(p))
	if err != nil {
		return 0
	}
	defer unix.Close(pfd)
	base := path.Base(p)
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	fh := os.NewFile(uintptr(fd), d.full(p))
	defer fh.Close()
	info, err := fh.Stat()
	if err == nil && info.Mode().IsRegular() && statcache.KeyOf(info) == k && unix.Unlinkat(pfd, base, 0) == nil {
		return 1
	}
	return 0
}
