package layout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sys/unix"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// ErrDigestMismatch is wrapped when fetched or written bytes do not match
// their digest: it is verify.ErrDigestMismatch, the one sentinel.
var ErrDigestMismatch = verify.ErrDigestMismatch

// PullOptions configure Pull. Zero values select defaults.
type PullOptions struct {
	Jobs     int        // concurrent chunk fetches; <= 0 means 8
	Cache    *StatCache // remembers verified files; nil disables it
	Counters *Counters  // progress; may be nil
	// VerifyFiles also checks each written file's SHA-256 against the
	// index before it is renamed into place (a second read of every byte).
	// Without it the chunk digests, checked as chunks arrive, vouch for
	// every byte.
	VerifyFiles bool
}

// PullResult describes a pull.
type PullResult struct {
	Files         int   // index entries
	Bytes         int64 // file bytes
	ChunksFetched int64
	BytesFetched  int64
	FilesReused   int   // files already present and verified
	ChunksCopied  int64 // chunks copied from files already in the directory
	BytesCopied   int64
	// ChunksCopiedUnhashed are the copied chunks taken, in the kernel and
	// unhashed, from files an earlier pull wrote and that are unchanged
	// since (by their stat keys in its record).
	ChunksCopiedUnhashed int64
	FilesRemoved         int // files an earlier pull wrote that this version lacks
	// FilesHashed are the files found at their final names with no record
	// to tell what they hold, read whole to compare with their digests.
	FilesHashed int
	// LocalMisses are chunks looked for in files already in the directory
	// that were not there after all, and were fetched.
	LocalMisses int64
}

// target is where part of a chunk goes: a range of a file being written.
type target struct {
	file              int // index into Index.Files
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

// resolve returns the targets the slots ss name.
func (x *Index) resolve(ss []slot) []target {
	ts := make([]target, len(ss))
	for k, s := range ss {
		chunkOff, n := x.extentAt(int(s.file), int(s.ext))
		ts[k] = target{file: int(s.file), fileOff: s.fileOff, chunkOff: chunkOff, n: n}
	}
	return ts
}

// tmpName is the name of the temporary file of the entry p in a pull's
// private directory: the same on every run, so a re-run finds it.
func tmpName(p string) string {
	h := sha256.Sum256([]byte(p))
	return hex.EncodeToString(h[:16]) + ".part"
}

// name is the temporary file's name in its directory.
func (pf pullFile) name() string { return tmpName(pf.path()) }

// tmpPath is the temporary file's path, for messages.
func (pf pullFile) tmpPath() string { return filepath.Join(pf.tmp().full, pf.name()) }

// open opens the temporary file again, by name in the private directory,
// and checks it is still the file this pull created.
func (pf pullFile) open(flags int) (*os.File, error) {
	fd, err := unix.Openat(pf.tmp().fd, pf.name(), flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: pf.tmpPath(), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: pf.tmpPath(), Err: err}
	}
	if uint64(st.Dev) != pf.tmp().dev || uint64(st.Ino) != pf.inode() {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w: the temporary file was replaced", pf.tmpPath(), ErrUnsafeDestination)
	}
	return os.NewFile(uintptr(fd), pf.tmpPath()), nil
}

// openWrite opens the temporary file for writing, creating it (empty, of
// the entry's size) on first use.
func (pf pullFile) openWrite() (*os.File, error) {
	mu := pf.lock()
	mu.Lock()
	defer mu.Unlock()
	if pf.created() {
		return pf.open(unix.O_WRONLY)
	}
	fh, leftover, err := pf.create()
	if err != nil {
		return nil, err
	}
	if leftover { // appeared since the pull looked: start it anew
		err = fh.Truncate(0)
	}
	if err == nil {
		err = fh.Truncate(pf.size())
	}
	if err != nil {
		fh.Close()
		return nil, err
	}
	pf.setCreated()
	return fh, nil
}

// Pull materialises the version v under dir. Files are written under a
// temporary name in a private directory inside dir, verified against their
// SHA-256 and renamed into place; every path under dir is resolved without
// following symlinks, so nothing is written outside dir. A re-run after an
// interruption fetches only the chunks that are missing.
func Pull(ctx context.Context, src content.Fetcher, v *Version, dir string, opt PullOptions) (*PullResult, error) {
	d, err := openDest(dir)
	if err != nil {
		return nil, err
	}
	res, err := pull(ctx, src, v, d, opt)
	d.close(err == nil)
	return res, err
}

func pull(ctx context.Context, src content.Fetcher, v *Version, d *destDir, opt PullOptions) (*PullResult, error) {
	p := newPuller(ctx, src, v, d, opt)
	if err := p.plan(); err != nil {
		return nil, err
	}
	if err := p.transfer(); err != nil {
		return nil, err
	}
	if err := p.finalise(); err != nil {
		return nil, err
	}
	return p.res, nil
}

// puller is one pull of a version into a destination: the state its steps
// share. plan decides what each file needs, transfer copies the chunks
// already in the destination and fetches the others (finishing each file
// as its last byte lands), finalise puts the symlinks and directory modes
// in place and saves the stat cache.
type puller struct {
	ctx context.Context // the caller's: cancelling it stops every step
	src content.Fetcher
	v   *Version
	x   *Index
	d   *destDir
	opt PullOptions
	res *PullResult

	files    *pullSet
	byChunk  [][]slot              // per chunk, the extents still to write
	previous map[string]cachedFile // what an earlier pull left here
	credited []int64               // per chunk, file bytes counted as written
	local    map[int]localChunk    // chunks to copy from the destination

	g    *errgroup.Group // the fetches
	gctx context.Context

	bufs     sync.Pool // 1 MiB buffers for streamed chunks
	packBufs sync.Pool // buffers for chunks fetched whole
	packSem  *semaphore.Weighted

	copiedChunks, copiedBytes, fetchedChunks, fetchedBytes, vouchedChunks, localMisses atomic.Int64

	readyMu sync.Mutex
	ready   []int           // finished files that wait for the local copies
	copying bool            // the local copies still run
	sources map[string]bool // paths local copies read from
}

func newPuller(ctx context.Context, src content.Fetcher, v *Version, d *destDir, opt PullOptions) *puller {
	if opt.Jobs <= 0 {
		opt.Jobs = 8
	}
	if opt.Counters == nil {
		opt.Counters = &Counters{}
	}
	x := v.Index
	p := &puller{
		ctx: ctx, src: src, v: v, x: x, d: d, opt: opt,
		res:      &PullResult{Files: x.Len(), Bytes: x.Bytes()},
		files:    newPullSet(x),
		byChunk:  x.targetSlots(),
		previous: opt.Cache.pulledFiles(),
		credited: make([]int64, x.NumChunks()),
		bufs:     sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }},
		packBufs: sync.Pool{New: func() any { return new([]byte) }},
		packSem:  semaphore.NewWeighted(packBudget),
		copying:  true,
	}
	opt.Counters.Total.Store(p.res.Bytes)
	return p
}

// plan makes the directories (parents sort before children, writable while
// they are filled), then looks at each regular file: one already in place
// is kept; for the others it lists, per chunk, the extents still to write
// (a leftover temporary file may hold some).
func (p *puller) plan() error {
	x := p.x
	// Nothing is at the names in a directory made now (or an empty
	// destination), so they need no look.
	made := map[string]bool{"": p.d.isEmpty()}
	for fi := range x.Len() {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		f := x.File(fi)
		if f.Type == TypeDir {
			m, err := p.d.ensureDir(f.Path)
			if err != nil {
				return err
			}
			made[f.Path] = m
		}
	}
	buf := make([]byte, 1<<20)
	dc := newDirFD(p.d)
	defer dc.close()
	for i := range x.Len() {
		f := x.fileRef(i)
		if f.Type != TypeFile {
			continue
		}
		if err := p.ctx.Err(); err != nil {
			return err
		}
		if err := p.planFile(i, f, made[parentOf(f.Path)], buf, dc); err != nil {
			return err
		}
	}
	return nil
}

// planFile plans the regular file f, entry i; fresh says its directory was
// made by this pull.
func (p *puller) planFile(i int, f *File, fresh bool, buf []byte, dc *dirFD) error {
	if err := digestKnown(f, p.x); err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	pf, done, err := p.d.prepareFile(p.ctx, f, p.x, p.opt.Cache, buf, dc, fresh, p.files, i)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	if pf.s == nil {
		p.res.FilesReused++
		p.opt.Counters.Processed.Add(f.Size)
		return nil
	}
	var off, remaining int64
	for k, e := range f.Extents {
		if k%ctxEvery == ctxEvery-1 {
			if err := p.ctx.Err(); err != nil {
				return err
			}
		}
		if !done[k] {
			p.byChunk[e.Chunk] = append(p.byChunk[e.Chunk], slot{file: int32(i), ext: int32(k), fileOff: off})
			remaining += e.Length
		} else {
			p.opt.Counters.Processed.Add(e.Length) // verified by a previous pull
		}
		off += e.Length
	}
	pf.remaining().Store(remaining)
	if remaining == 0 {
		p.ready = append(p.ready, i)
	}
	return nil
}

// transfer writes every chunk still needed. Chunks already in the
// destination (an earlier version, or a file at the same place) are copied
// from there, verified like fetched ones, while the others are fetched. No
// file that is a copy's source is renamed into place until the copies are
// done.
func (p *puller) transfer() error {
	p.g, p.gctx = errgroup.WithContext(p.ctx)
	p.g.SetLimit(p.opt.Jobs)
	local, err := p.d.localChunks(p.ctx, p.x, p.byChunk, p.files, p.previous)
	if err != nil {
		return err
	}
	p.local = local
	p.sources = make(map[string]bool, len(local))
	for _, loc := range local {
		p.sources[loc.path] = true
	}
	pending := p.ready
	p.ready = nil
	for _, i := range pending {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		if err := p.finish(i); err != nil {
			return err
		}
	}
	lg, lctx := errgroup.WithContext(p.gctx)
	lg.SetLimit(p.opt.Jobs)
	copies := make(chan struct{})
	go func() {
		defer close(copies)
		for k, loc := range local {
			if lctx.Err() != nil {
				break
			}
			desc, ts := p.v.Chunk(k), p.x.resolve(p.byChunk[k])
			lg.Go(func() error { return p.copyLocal(lctx, k, loc, desc, ts) })
		}
	}()
	for k, ts := range p.byChunk {
		if p.ctx.Err() != nil {
			break // cancelled: a failed fetch does not stop the others (a resume needs fewer)
		}
		if _, ok := local[k]; len(ts) > 0 && !ok {
			p.fetch(k)
		}
	}
	<-copies
	lerr := lg.Wait()
	p.readyMu.Lock()
	p.copying = false
	p.readyMu.Unlock()
	if lerr == nil {
		for _, i := range p.ready {
			if lerr = p.ctx.Err(); lerr != nil {
				break
			}
			if lerr = p.d.finishFile(p.x.fileRef(i), p.x, p.files.at(i), p.opt); lerr != nil {
				break
			}
		}
	}
	if err := p.g.Wait(); err != nil {
		return err
	}
	if lerr != nil {
		return lerr
	}
	return p.ctx.Err()
}

// copyLocal copies chunk k (desc, with its targets ts) from where loc says
// it is in the destination: in the kernel if an earlier pull vouches for
// the bytes there, else read and verified. Bytes that are not the chunk's
// are fetched instead.
func (p *puller) copyLocal(ctx context.Context, k int, loc localChunk, desc ocispec.Descriptor, ts []target) error {
	buf := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(buf)
	err := loc.copyVouched(ctx, desc, ts, p.files, p.opt.Counters, &p.credited[k])
	if errors.Is(err, errNotVouched) {
		err = streamChunk(ctx, loc, desc, ts, p.files, *buf, p.opt.Counters, &p.credited[k])
	} else if err == nil {
		p.vouchedChunks.Add(1)
	}
	var we writeError
	if errors.As(err, &we) {
		return p.chunkError(desc, ts, err)
	}
	if err != nil {
		// The bytes there are not the chunk's (a tensor a fine-tune
		// rewrote in place): fetch it now, while the other copies go on,
		// not after them.
		p.localMisses.Add(1)
		if ctx.Err() == nil {
			p.fetch(k)
		}
		return nil
	}
	p.copiedChunks.Add(1)
	p.copiedBytes.Add(desc.Size)
	return p.written(ts)
}

// chunkError names the chunk desc and the first file of its targets ts in
// err.
func (p *puller) chunkError(desc ocispec.Descriptor, ts []target, err error) error {
	return fmt.Errorf("chunk %s (for %s): %w", desc.Digest, p.x.Path(ts[0].file), err)
}

// fetch fetches chunk k in the fetch group: whole if it is packed, else
// streamed to its targets.
func (p *puller) fetch(k int) {
	desc, ts := p.v.Chunk(k), p.x.resolve(p.byChunk[k])
	p.g.Go(func() error {
		if packed(desc, ts) {
			return p.fetchPacked(desc, ts)
		}
		buf := p.bufs.Get().(*[]byte)
		defer p.bufs.Put(buf)
		// Bytes written by a failed attempt sit in temporary files only;
		// the next attempt writes all of them again.
		err := p.retry(func() error {
			return streamChunk(p.gctx, p.src, desc, ts, p.files, *buf, p.opt.Counters, &p.credited[k])
		})
		if err != nil {
			return p.chunkError(desc, ts, err)
		}
		p.fetchedChunks.Add(1)
		p.fetchedBytes.Add(desc.Size)
		return p.written(ts)
	})
}

// retry runs fetch, a fetch from the pull's source, again while it fails
// in a way another try may cure.
func (p *puller) retry(fetch func() error) error {
	return fetchRetrying(p.gctx, p.src, fetch)
}

// fetchPacked fetches chunk desc (with its targets ts) whole, then writes
// each file that lies wholly in it straight to its temporary file and into
// place.
func (p *puller) fetchPacked(desc ocispec.Descriptor, ts []target) error {
	if err := p.packSem.Acquire(p.gctx, desc.Size); err != nil {
		return err
	}
	defer p.packSem.Release(desc.Size)
	bp := p.packBufs.Get().(*[]byte)
	defer p.packBufs.Put(bp)
	var data []byte
	err := p.retry(func() (err error) {
		data, err = fetchWhole(p.gctx, p.src, desc, bp, p.opt.Counters)
		return err
	})
	if err != nil {
		return p.chunkError(desc, ts, err)
	}
	p.fetchedChunks.Add(1)
	p.fetchedBytes.Add(desc.Size)
	rest, err := p.writePacked(desc, data, ts)
	if err != nil {
		return err
	}
	return p.written(rest)
}

// writePacked writes the verified bytes data of chunk desc to its targets
// ts: a file wholly in it straight into place, the others through their
// temporary files, whose targets it returns.
func (p *puller) writePacked(desc ocispec.Descriptor, data []byte, ts []target) ([]target, error) {
	x := p.x
	wdc := newDirFD(p.d)
	defer wdc.close()
	open := &openFiles{files: p.files}
	defer open.close()
	var rest []target // targets written through the temporary file
	var n int64
	for _, t := range ts {
		if err := p.ctx.Err(); err != nil {
			return nil, err // cancelled (a failed sibling does not stop these writes)
		}
		pf := p.files.at(t.file)
		block := data[t.chunkOff : t.chunkOff+t.n]
		n += t.n
		// Only a file's first extent starts at 0 (empty ones aside): the
		// file's size, a sum of its extents, is taken once.
		if t.fileOff == 0 && t.n > 0 && t.n == x.size(t.file) && !p.waits(t.file) {
			f := x.fileRef(t.file)
			ok, err := p.d.writeWhole(x, pf, f, block, wdc, p.opt)
			if err != nil {
				return nil, fmt.Errorf("chunk %s (for %s): %w", desc.Digest, f.Path, err)
			}
			if ok {
				pf.remaining().Add(-t.n)
				continue
			}
		}
		fh, err := open.get(t.file)
		if err == nil {
			_, err = fh.WriteAt(block, t.fileOff)
		}
		if err != nil {
			return nil, fmt.Errorf("chunk %s (for %s): %w", desc.Digest, x.Path(t.file), err)
		}
		rest = append(rest, t)
	}
	if err := open.close(); err != nil {
		return nil, p.chunkError(desc, ts, err)
	}
	p.opt.Counters.Processed.Add(n)
	return rest, nil
}

// written counts the targets ts as written, and finishes each file whose
// last bytes they were.
func (p *puller) written(ts []target) error {
	for _, t := range ts {
		if p.files.at(t.file).remaining().Add(-t.n) == 0 {
			if err := p.finish(t.file); err != nil {
				return err
			}
		}
	}
	return nil
}

// waits reports whether file i must wait for the local copies before it is
// renamed into place.
func (p *puller) waits(i int) bool {
	p.readyMu.Lock()
	defer p.readyMu.Unlock()
	return p.copying && p.sources[p.x.Path(i)]
}

// finish renames file i, all written, into place, or, while local copies
// may still read it at its final name, queues it.
func (p *puller) finish(i int) error {
	p.readyMu.Lock()
	if p.copying && p.sources[p.x.Path(i)] {
		p.ready = append(p.ready, i)
		p.readyMu.Unlock()
		return nil
	}
	p.readyMu.Unlock()
	return p.d.finishFile(p.x.fileRef(i), p.x, p.files.at(i), p.opt)
}

// finalise fills in the result, removes the files an earlier pull wrote
// that the version lacks, makes the symlinks, sets the directories' modes
// (children first) and saves the stat cache.
func (p *puller) finalise() error {
	x, d, res := p.x, p.d, p.res
	res.ChunksFetched, res.BytesFetched = p.fetchedChunks.Load(), p.fetchedBytes.Load()
	res.ChunksCopied, res.BytesCopied = p.copiedChunks.Load(), p.copiedBytes.Load()
	res.ChunksCopiedUnhashed = p.vouchedChunks.Load()
	res.FilesRemoved = d.removeStale(x, p.previous)
	res.FilesHashed = int(d.filesHashed.Load())
	res.LocalMisses = p.localMisses.Load()
	for fi := range x.Len() {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		f := x.File(fi)
		if f.Type == TypeSymlink {
			if err := d.ensureSymlink(f.Path, f.Target); err != nil {
				return err
			}
		}
	}
	for i := x.Len() - 1; i >= 0; i-- {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		if f := x.File(i); f.Type == TypeDir {
			if err := d.chmodDir(f.Path, f.Mode); err != nil {
				return err
			}
		}
	}
	p.opt.Cache.prune(func(path string) bool {
		i, ok := x.Find(path)
		return ok && x.Kind(i) == TypeFile
	})
	p.opt.Cache.settle(p.ctx, d.statKey)
	if err := p.opt.Cache.Save(); err != nil {
		return fmt.Errorf("save stat cache: %w", err)
	}
	return nil
}

// emptyDigest is the SHA-256 of no bytes.
var emptyDigest = digest.FromBytes(nil)

// digestKnown checks the file's SHA-256 where the index alone tells what it
// must be, with no byte read: an empty file, or one whole chunk (whose
// digest is the file's). Other files' digests are checked on request.
func digestKnown(f *File, x *Index) error {
	want := derivedDigest(f, x)
	if want == "" {
		return nil
	}
	return verify.Digest("file "+f.Path+" in the index", ocispec.Descriptor{Digest: f.Digest, Size: f.Size}, want, f.Size)
}

// derivedDigest returns the SHA-256 of the file where its chunks' digests
// give it (an empty file, or one whole chunk), or "".
func derivedDigest(f *File, x *Index) digest.Digest {
	switch {
	case f.Size == 0:
		return emptyDigest
	case len(f.Extents) == 1:
		if e := f.Extents[0]; e.Offset == 0 && e.Length == x.ChunkSize(e.Chunk) {
			return x.ChunkDigest(e.Chunk)
		}
	}
	return ""
}

// ctxEvery is how many cheap steps a loop whose length the volume decides
// takes between looks at its context; loops whose steps do I/O look at
// every step.
const ctxEvery = 1 << 12

// fetchAttempts bounds the fetches of one chunk: a body cut short or
// corrupted in transit is fetched again.
const fetchAttempts = 3

// writeError marks a failure to write the local file, which a re-fetch
// does not cure.
type writeError struct{ error }

func (e writeError) Unwrap() error { return e.error }

// refetchable reports whether fetching a chunk again may succeed.
func refetchable(ctx context.Context, err error) bool {
	var we writeError
	return ctx.Err() == nil && !errors.As(err, &we) && !errors.Is(err, errdef.ErrNotFound)
}

// openFiles keeps a few temporary files open while a chunk is written to
// them, so that open descriptors stay bounded whatever the file count.
type openFiles struct {
	files *pullSet
	open  []openFile
}

type openFile struct {
	i  int
	fh *os.File
}

const maxOpenPerChunk = 4

func (o *openFiles) get(i int) (*os.File, error) {
	for _, of := range o.open {
		if of.i == i {
			return of.fh, nil
		}
	}
	if len(o.open) == maxOpenPerChunk {
		if err := o.open[0].fh.Close(); err != nil {
			return nil, err
		}
		o.open = append(o.open[:0], o.open[1:]...)
	}
	fh, err := o.files.at(i).openWrite()
	if err != nil {
		return nil, err
	}
	o.open = append(o.open, openFile{i, fh})
	return fh, nil
}

func (o *openFiles) close() error {
	var first error
	for _, of := range o.open {
		if err := of.fh.Close(); err != nil && first == nil {
			first = err
		}
	}
	o.open = nil
	return first
}

// streamChunk fetches one chunk and writes it to its targets as it
// arrives, verifying its size and digest. The targets' files are not
// renamed into place unless this returns nil, so unverified bytes are never
// visible under a final name. File bytes written count as processed once:
// credited is how far into the chunk earlier attempts counted.
func streamChunk(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, ts []target, files *pullSet, buf []byte, c *Counters, credited *int64) error {
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		return err
	}
	defer rc.Close()
	open := &openFiles{files: files}
	defer open.close()
	h := sha256.New()
	var off int64
	for off < desc.Size {
		n, rerr := io.ReadFull(rc, buf[:min(int64(len(buf)), desc.Size-off)])
		if n > 0 {
			block := buf[:n]
			h.Write(block)
			var written int64
			for _, t := range ts {
				lo, hi := max(off, t.chunkOff), min(off+int64(n), t.chunkOff+t.n)
				if lo >= hi {
					continue
				}
				f, err := open.get(t.file)
				if err != nil {
					return writeError{err}
				}
				mu := files.at(t.file).writing()
				mu.Lock()
				_, err = f.WriteAt(block[lo-off:hi-off], t.fileOff+lo-t.chunkOff)
				mu.Unlock()
				if err != nil {
					return writeError{err}
				}
				if hi > *credited {
					written += hi - max(lo, *credited)
				}
			}
			off += int64(n)
			*credited = max(*credited, off)
			c.Sent.Add(int64(n))
			c.Processed.Add(written)
		}
		if rerr != nil {
			if off < desc.Size {
				return fmt.Errorf("read after %d of %d bytes: %w", off, desc.Size, rerr)
			}
			break
		}
	}
	if err := verify.End("chunk", desc, rc, digest.NewDigest(digest.SHA256, h), off); err != nil {
		return err
	}
	if err := open.close(); err != nil {
		return writeError{err}
	}
	return nil
}

// prepareFile looks at what is at the final name of the regular file f. If
// it already holds f's bytes, has no other link, its mode is set (through a
// descriptor) and prepareFile returns a zero pullFile. Otherwise it creates
// the temporary file, or reuses one left by an interrupted pull, and
// reports which extents it already holds. Bytes at the final name that
// match but have other links are copied, not modified in place. dc holds
// the parent directory's descriptor; fresh says that directory was made by
// this pull, so nothing is at the final name to look at. f is entry i of
// x; the file to write is added to files (a zero pullFile: nothing to write).
func (d *destDir) prepareFile(ctx context.Context, f *File, x *Index, cache *StatCache, buf []byte, dc *dirFD, fresh bool, files *pullSet, i int) (pullFile, []bool, error) {
	parent := parentOf(f.Path)
	pfd, dev, err := dc.get(parent)
	if err != nil {
		return pullFile{}, nil, err
	}
	var existing *os.File
	var verified bool
	if !fresh {
		if existing, verified, err = d.matchingFile(pfd, f, x, cache); err != nil {
			return pullFile{}, nil, err
		}
	}
	if existing != nil {
		defer existing.Close()
		info, err := existing.Stat()
		if err != nil {
			return pullFile{}, nil, err
		}
		if nlink(info) == 1 {
			if uint32(info.Mode().Perm()) != f.Mode {
				if err := existing.Chmod(os.FileMode(f.Mode)); err != nil {
					return pullFile{}, nil, err
				}
				if info, err = existing.Stat(); err != nil {
					return pullFile{}, nil, err
				}
			}
			cache.storePulled(x, f.Path, statKey(info), true, verified)
			return pullFile{}, nil, nil
		}
	}
	tmp, err := d.tmpFor(pfd, dev, parent)
	if err != nil {
		return pullFile{}, nil, err
	}
	pf := files.add(i, tmp, verified)
	done := make([]bool, len(f.Extents))
	if existing == nil && f.Size > 0 && !tmp.names[pf.name()] {
		// The temporary file is created when the first chunk arrives,
		// unless an interrupted pull left one to look at.
		return pf, done, nil
	}
	fh, leftover, err := pf.create()
	if err != nil {
		return pullFile{}, nil, err
	}
	defer fh.Close()
	pf.setCreated()
	switch {
	case existing != nil:
		// Hard-linked elsewhere: copy the verified bytes into a new file.
		if err := fh.Truncate(0); err != nil {
			return pullFile{}, nil, err
		}
		if _, err := io.CopyBuffer(fh, io.NewSectionReader(existing, 0, f.Size), buf); err != nil {
			return pullFile{}, nil, err
		}
		for k := range done {
			done[k] = true
		}
	case leftover:
		info, err := fh.Stat()
		if err != nil {
			return pullFile{}, nil, err
		}
		if info.Size() == f.Size && f.Size > 0 {
			done, _ = leftoverExtents(ctx, fh, f, x, buf)
			return pf, done, nil
		}
		fallthrough
	default:
		if err := fh.Truncate(0); err != nil {
			return pullFile{}, nil, err
		}
		if err := fh.Truncate(f.Size); err != nil {
			return pullFile{}, nil, err
		}
	}
	return pf, done, nil
}

// matchingFile returns the file at f's final name, open, if it is a
// regular file that holds f's bytes; else nil. It never follows a symlink.
// It reports whether the bytes were checked against f's digest (by it or by
// the pull the cache vouches for), not only known to be f's chunks.
func (d *destDir) matchingFile(pfd int, f *File, x *Index, cache *StatCache) (*os.File, bool, error) {
	base := path.Base(f.Path)
	st, ok, err := lstatAt(pfd, base)
	if err != nil {
		return nil, false, &os.PathError{Op: "lstat", Path: d.full(f.Path), Err: err}
	}
	if !ok || !isRegular(&st) || st.Size != f.Size {
		return nil, false, nil
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, nil // replaced, or not readable: write it anew
	}
	fh := os.NewFile(uintptr(fd), d.full(f.Path))
	info, err := fh.Stat()
	if err != nil || !info.Mode().IsRegular() || info.Size() != f.Size {
		fh.Close()
		return nil, false, nil
	}
	key := statKey(info)
	if c, ok := cache.lookup(f.Path, key); ok {
		if c.Digest == f.Digest {
			return fh, true, nil
		}
		fh.Close()
		return nil, false, nil
	}
	if cache.sameExtents(f.Path, key, f, x) {
		// Written from the same chunks: f's bytes, whatever its digest
		// claims, which stays unchecked.
		return fh, derivedDigest(f, x) != "", nil
	}
	if cache.recordedOther(f.Path, key, f.Digest) {
		// An earlier pull wrote it, from other chunks, as a file with
		// another digest (a fine-tune keeps sizes): hashing it would read
		// it whole to find it differs. Were that digest a lie and the
		// bytes f's, writing them anew from chunks costs no more.
		fh.Close()
		return nil, false, nil
	}
	if holeIn(fh, 0, f.Size) {
		// A pull writes every byte of a file; a sparse one was planted or
		// copied sparse. Hashing it would read its declared size (of
		// zeros, for the holes) for nothing: it is rewritten instead.
		fh.Close()
		return nil, false, nil
	}
	d.filesHashed.Add(1)
	got, err := readerDigest(io.NewSectionReader(fh, 0, f.Size))
	if err != nil || verify.Digest(f.Path, ocispec.Descriptor{Digest: f.Digest, Size: f.Size}, got, f.Size) != nil {
		fh.Close()
		return nil, false, nil
	}
	return fh, true, nil
}

func nlink(info os.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}

// create creates the temporary file exclusively. One left by an
// interrupted pull is reused (leftover is true) only if it is a regular
// file with one link, owned by this user; anything else at its name is
// removed first (never followed).
func (pf pullFile) create() (fh *os.File, leftover bool, err error) {
	fd, leftover, err := pf.createFD()
	if err != nil {
		return nil, false, err
	}
	return os.NewFile(uintptr(fd), pf.tmpPath()), leftover, nil
}

// createFD is create, returning the descriptor.
func (pf pullFile) createFD() (fd int, leftover bool, err error) {
	const create = unix.O_RDWR | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err = unix.Openat(pf.tmp().fd, pf.name(), create, 0o600)
	if errors.Is(err, unix.EEXIST) {
		fd, err = unix.Openat(pf.tmp().fd, pf.name(), unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && isRegular(&st) && st.Nlink == 1 && int(st.Uid) == os.Geteuid() {
				leftover = true
			} else {
				unix.Close(fd)
			}
		}
		if !leftover {
			if err := unix.Unlinkat(pf.tmp().fd, pf.name(), 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return -1, false, &os.PathError{Op: "remove", Path: pf.tmpPath(), Err: err}
			}
			fd, err = unix.Openat(pf.tmp().fd, pf.name(), create, 0o600)
		}
	}
	if err != nil {
		return -1, false, &os.PathError{Op: "create", Path: pf.tmpPath(), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, false, &os.PathError{Op: "stat", Path: pf.tmpPath(), Err: err}
	}
	if uint64(st.Dev) != pf.tmp().dev {
		unix.Close(fd)
		return -1, false, fmt.Errorf("%s: %w: the temporary file is on another device than its directory", pf.tmpPath(), ErrUnsafeDestination)
	}
	pf.setInode(uint64(st.Ino))
	return fd, leftover, nil
}

// leftoverExtents reports which extents of f the temporary file fh, of
// f.Size bytes and left by an interrupted pull, already holds: extents that
// cover a whole chunk and hold its bytes. Holes are never read (a hole was
// never written); data is hashed as a stream through buf. read is the
// number of bytes read.
func leftoverExtents(ctx context.Context, fh *os.File, f *File, x *Index, buf []byte) (done []bool, read int64) {
	done = make([]bool, len(f.Extents))
	sc, err := fh.SyscallConn()
	if err != nil {
		return done, 0
	}
	// holeAt returns where the next hole at or after off starts (the end of
	// the file if there is none, or if the file system cannot tell).
	holeAt := func(off int64) int64 {
		end := f.Size
		_ = sc.Control(func(fd uintptr) {
			if n, err := unix.Seek(int(fd), off, unix.SEEK_HOLE); err == nil {
				end = n
			}
		})
		return end
	}
	dataAt := func(off int64) int64 {
		next := off
		_ = sc.Control(func(fd uintptr) {
			if n, err := unix.Seek(int(fd), off, unix.SEEK_DATA); err == nil {
				next = n
			} else if errors.Is(err, unix.ENXIO) {
				next = f.Size // only a hole from off to the end
			}
		})
		return next
	}
	var off, hole, data int64 // [data, hole) is the data run around off, once known
	hole = -1
	for k, e := range f.Extents {
		start, end := off, off+e.Length
		off = end
		if e.Offset != 0 || e.Length != x.ChunkSize(e.Chunk) || ctx.Err() != nil {
			continue // a cancelled pull returns from its plan
		}
		if start >= hole {
			data = dataAt(start)
			hole = f.Size
			if data < f.Size {
				hole = holeAt(data)
			}
		}
		if start < data || end > hole {
			continue // partly a hole: never written whole
		}
		h := sha256.New()
		n, err := io.CopyBuffer(h, io.NewSectionReader(fh, start, e.Length), buf)
		read += n
		if err == nil && verify.Digest("chunk", x.ChunkDescriptor(e.Chunk), digest.NewDigest(digest.SHA256, h), n) == nil {
			done[k] = true
		}
	}
	return done, read
}

// holeIn reports whether the file fh has a hole (a range never written,
// which reads as zeros without being stored) in [off, off+n), asking the
// file system with SEEK_HOLE and reading nothing. Where the file system
// cannot tell, it reports false. It moves the file offset: callers read
// with ReadAt.
func holeIn(fh *os.File, off, n int64) bool {
	if n <= 0 {
		return false
	}
	sc, err := fh.SyscallConn()
	if err != nil {
		return false
	}
	hole := false
	_ = sc.Control(func(fd uintptr) {
		if h, err := unix.Seek(int(fd), off, unix.SEEK_HOLE); err == nil {
			hole = h < off+n
		}
	})
	return hole
}

// finishFile sets the mode of a file whose chunks are all written and
// verified (with opt.VerifyFiles, after checking its SHA-256 too) and
// renames it into place, checking right before that the name is still the
// file it wrote. A file that does not match is removed.
func (d *destDir) finishFile(f *File, x *Index, pf pullFile, opt PullOptions) error {
	if f.Size == 0 {
		fh, err := pf.openWrite() // no chunk made it: create it now
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		fh.Close()
	}
	fh, err := pf.open(unix.O_RDONLY)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	defer fh.Close()
	if opt.VerifyFiles {
		got, err := readerDigest(io.NewSectionReader(fh, 0, f.Size))
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		if err := verify.Digest("file "+f.Path, ocispec.Descriptor{Digest: f.Digest, Size: f.Size}, got, f.Size); err != nil {
			_ = unix.Unlinkat(pf.tmp().fd, pf.name(), 0)
			return err
		}
	}
	if err := fh.Chmod(os.FileMode(f.Mode)); err != nil {
		return err
	}
	pfd, err := d.openDir(parentOf(f.Path))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := d.renameInto(pf, pfd, f.Path); err != nil {
		return err
	}
	if info, err := fh.Stat(); err == nil {
		// Every byte came from a verified chunk (or a verified leftover);
		// the file's digest is checked only if asked for or implied.
		verified := opt.VerifyFiles || pf.verified() || derivedDigest(f, x) != ""
		opt.Cache.storePulled(x, f.Path, statKey(info), true, verified)
	}
	return nil
}

func readerDigest(r io.Reader) (digest.Digest, error) {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	return digest.NewDigest(digest.SHA256, h), nil
}
