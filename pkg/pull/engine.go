package pull

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/sha2x"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// Materialise writes the version v, its chunks fetched from src, under dir
// (see the package documentation); of opt it uses Jobs, StatCache,
// Counters and VerifyFiles, and of the result it fills what the writing
// decides. Files are written under a temporary name in a private
// directory inside dir, verified and renamed into place; every path under
// dir is resolved without following symlinks, so nothing is written
// outside dir. A re-run after an interruption fetches only the chunks that
// are missing.
func Materialise(ctx context.Context, src content.Fetcher, v *layout.Version, dir string, opt Options) (*Result, error) {
	d, err := openDest(dir)
	if err != nil {
		return nil, err
	}
	res, err := materialise(ctx, src, v, d, opt)
	d.close(err == nil)
	return res, err
}

func materialise(ctx context.Context, src content.Fetcher, v *layout.Version, d *destDir, opt Options) (*Result, error) {
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
	v   *layout.Version
	x   *layout.Index
	d   *destDir
	opt Options
	res *Result

	selected []bool // by entry number, what the pull writes (Options.Select)
	files    *pullSet
	byChunk  [][]slot                 // per chunk, the extents still to write
	previous *statcache.PulledRecords // what an earlier pull left here
	// same marks the entries of index pieces the last whole pull here
	// wrote as they are (nil: none).
	same     []bool
	credited []int64            // per chunk, file bytes counted as written
	local    map[int]localChunk // chunks to copy from the destination

	g    *errgroup.Group // the fetches
	gctx context.Context

	bufs     sync.Pool    // 1 MiB buffers for streamed chunks
	pairs    sha2x.Pairer // streamed chunks are hashed two at a time
	packBufs sync.Pool    // buffers for chunks fetched whole
	packSem  *semaphore.Weighted

	copiedChunks, copiedBytes, fetchedChunks, fetchedBytes, vouchedChunks, localMisses atomic.Int64

	dirs sharedDirs // directories the jobs write packed files into

	readyMu sync.Mutex
	ready   []int           // finished files that wait for the local copies
	copying bool            // the local copies still run
	sources map[string]bool // paths local copies read from
}

func newPuller(ctx context.Context, src content.Fetcher, v *layout.Version, d *destDir, opt Options) *puller {
	if opt.Jobs <= 0 {
		opt.Jobs = 8
	}
	if jobs := fitJobs(opt.Jobs); jobs < opt.Jobs {
		if opt.Logf != nil {
			opt.Logf("%d jobs instead of %d, to stay under the limit on open files (ulimit -n)", jobs, opt.Jobs)
		}
		opt.Jobs = jobs
	}
	if opt.Counters == nil {
		opt.Counters = &progress.Counters{}
	}
	x := v.Index
	p := &puller{
		ctx: ctx, src: src, v: v, x: x, d: d, opt: opt,
		res:      &Result{Files: x.Len(), Bytes: x.Bytes()},
		selected: x.Selection(opt.Select),
		files:    newPullSet(x),
		byChunk:  targetSlots(x),
		previous: opt.StatCache.PulledFiles(),
		credited: make([]int64, x.NumChunks()),
		bufs:     sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }},
		packBufs: sync.Pool{New: func() any { return new([]byte) }},
		packSem:  semaphore.NewWeighted(packBudget),
		copying:  true,
	}
	if opt.Select != nil {
		p.res.Files, p.res.Bytes = 0, 0
		for i, ok := range p.selected {
			if ok {
				p.res.Files++
				p.res.Bytes += sizeOf(x, i)
			}
		}
	}
	opt.Counters.Total.Store(p.res.Bytes)
	p.same = samePieces(x, opt.StatCache.TakePulledPieces(), opt.Select == nil)
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
		if f.Type == layout.TypeDir && p.selected[fi] {
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
		if !p.selected[i] || x.Kind(i) != layout.TypeFile {
			continue
		}
		f := fileAt(x, i)
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
func (p *puller) planFile(i int, f *layout.File, fresh bool, buf []byte, dc *dirFD) error {
	if err := digestKnown(f, p.x); err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	if !fresh && p.same != nil && p.same[i] && p.keepUnlooked(f) {
		return nil
	}
	pf, done, err := p.d.prepareFile(p.ctx, f, p.x, p.opt.StatCache, buf, dc, fresh, p.files, i)
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
	// Delta chunks whose base may be in the directory are fetched with
	// the local copies, before any file is renamed over its base.
	var nearBase []int
	if bases := p.localBases(); len(bases) > 0 {
		p.gctx = layout.WithLocalBases(p.gctx, baseFinder(bases))
		for k, ts := range p.byChunk {
			if _, ok := local[k]; ok || len(ts) == 0 {
				continue
			}
			if d, ok := p.x.Delta(k); ok {
				if loc, ok := bases[d.Base]; ok {
					nearBase = append(nearBase, k)
					p.sources[loc.path] = true
				}
			}
		}
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
			desc, ts := p.v.Chunk(k), resolve(p.x, p.byChunk[k])
			lg.Go(func() error { return p.copyLocal(lctx, k, loc, desc, ts) })
		}
		for _, k := range nearBase {
			if lctx.Err() != nil {
				break
			}
			lg.Go(func() error { return p.fetchChunk(k) })
		}
	}()
	near := make(map[int]bool, len(nearBase))
	for _, k := range nearBase {
		near[k] = true
	}
	for k, ts := range p.byChunk {
		if p.ctx.Err() != nil {
			break // cancelled: a failed fetch does not stop the others (a resume needs fewer)
		}
		if _, ok := local[k]; len(ts) > 0 && !ok && !near[k] {
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
			if lerr = p.d.finishFile(fileAt(p.x, i), p.x, p.files.at(i), p.opt); lerr != nil {
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
		err = streamChunk(ctx, loc, desc, ts, p.files, *buf, p.opt.Counters, &p.credited[k], &p.pairs)
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
	p.g.Go(func() error { return p.fetchChunk(k) })
}

// fetchChunk fetches chunk k: whole if it is packed, else streamed to its
// targets.
func (p *puller) fetchChunk(k int) error {
	desc, ts := p.v.Chunk(k), resolve(p.x, p.byChunk[k])
	{
		if packed(desc, ts) {
			return p.fetchPacked(desc, ts)
		}
		buf := p.bufs.Get().(*[]byte)
		defer p.bufs.Put(buf)
		// Bytes written by a failed attempt sit in temporary files only;
		// the next attempt writes all of them again.
		err := p.retry(func() error {
			return streamChunk(p.gctx, p.src, desc, ts, p.files, *buf, p.opt.Counters, &p.credited[k], &p.pairs)
		})
		if err != nil {
			return p.chunkError(desc, ts, err)
		}
		p.fetchedChunks.Add(1)
		p.fetchedBytes.Add(desc.Size)
		return p.written(ts)
	}
}

// retry runs fetch, a fetch from the pull's source, again while it fails
// in a way another try may cure: the one retry loop, the format's. A
// failure to write the local file is not cured by fetching again.
func (p *puller) retry(fetch func() error) error {
	var werr error
	err := layout.FetchRetrying(p.gctx, p.src, func() error {
		err := fetch()
		if errors.As(err, new(writeError)) {
			werr = err
			return nil // no retry
		}
		return err
	})
	if werr != nil {
		return werr
	}
	return err
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
	wdc := newSharedDirFD(p.d, &p.dirs)
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
		if t.fileOff == 0 && t.n > 0 && t.n == sizeOf(x, t.file) && !p.waits(t.file) {
			f := fileAt(x, t.file)
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
	return p.d.finishFile(fileAt(p.x, i), p.x, p.files.at(i), p.opt)
}

// finalise fills in the result, removes the files an earlier pull wrote
// that the version lacks, makes the symlinks, sets the directories' modes
// (children first) and saves the stat cache.
func (p *puller) finalise() error {
	x, d, res := p.x, p.d, p.res
	res.ChunksFetched, res.BytesFetched = p.fetchedChunks.Load(), p.fetchedBytes.Load()
	res.ChunksCopied, res.BytesCopied = p.copiedChunks.Load(), p.copiedBytes.Load()
	res.ChunksCopiedUnhashed = p.vouchedChunks.Load()
	res.FilesRemoved = d.removeStale(x, p.previous, p.opt.Select)
	res.FilesHashed = int(d.filesHashed.Load())
	res.LocalMisses = p.localMisses.Load()
	for fi := range x.Len() {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		if !p.selected[fi] {
			continue
		}
		f := x.File(fi)
		if f.Type == layout.TypeSymlink {
			if err := d.ensureSymlink(f.Path, f.Target); err != nil {
				return err
			}
		}
	}
	for i := x.Len() - 1; i >= 0; i-- {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		if f := x.File(i); f.Type == layout.TypeDir && p.selected[i] {
			if err := d.chmodDir(f.Path, f.Mode); err != nil {
				return err
			}
		}
	}
	if err := p.opt.StatCache.SavePulled(p.ctx, x, p.opt.Select, d.statKey); err != nil {
		return fmt.Errorf("save stat cache: %w", err)
	}
	return nil
}

// ctxEvery is how many cheap steps a loop whose length the volume decides
// takes between looks at its context; loops whose steps do I/O look at
// every step.
const ctxEvery = 1 << 12

// writeError marks a failure to write the local file, which a re-fetch
// does not cure.
type writeError struct{ error }

func (e writeError) Unwrap() error { return e.error }

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
func streamChunk(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, ts []target, files *pullSet, buf []byte, c *progress.Counters, credited *int64, pairs *sha2x.Pairer) error {
	// A delta chunk whose base is fetched comes decoded piece by piece as
	// the base streams in, for this loop to hash (paired) and write as it
	// does a plain chunk's bytes; one decoded whole is verified already
	// (its pieces hashed two at a time too).
	rc, err := src.Fetch(layout.WithStreamedDeltas(layout.WithHashPairs(ctx, pairs)), desc)
	if err != nil {
		return err
	}
	defer rc.Close()
	open := &openFiles{files: files}
	defer open.close()
	// Bytes a decoder already verified (a delta chunk) are not hashed again.
	checked := verify.CheckedOf(rc)
	vouched := checked.Vouches(desc)
	var h hash.Hash = discard{}
	if !vouched {
		h = newChunkHash()
	}
	// Each half of buf in turn: a half is hashed beside another
	// goroutine's chunk while it is written and the other half read, when
	// one is offered meanwhile (else alone, before the next is offered).
	hs := pairs.Stream(h)
	defer hs.Wait() // nothing hashes buf after a return
	halves := [2][]byte{buf[:len(buf)/2], buf[len(buf)/2:]}
	var off int64
	for k := 0; off < desc.Size; k ^= 1 {
		var (
			block []byte
			rerr  error
		)
		if vouched {
			// Written from the decoder's buffer itself, not copied
			// through buf.
			block = checked.Bytes()[off:min(off+int64(len(buf)), desc.Size)]
		} else {
			half := halves[k]
			var n int
			n, rerr = io.ReadFull(rc, half[:min(int64(len(half)), desc.Size-off)])
			block = half[:n]
		}
		if n := len(block); n > 0 {
			hs.Write(block)
			written, err := writeBlock(block, off, ts, files, open, *credited)
			if err != nil {
				return err
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
	hs.Wait()
	if !vouched {
		if err := verify.End("chunk", desc, rc, digest.NewDigest(digest.SHA256, h), off); err != nil {
			return err
		}
	}
	if err := open.close(); err != nil {
		return writeError{err}
	}
	return nil
}

// writeBlock writes block, bytes [off, off+len(block)) of a chunk, to the
// chunk's targets ts, and returns how many of them are beyond credited
// (not counted as processed before).
func writeBlock(block []byte, off int64, ts []target, files *pullSet, open *openFiles, credited int64) (int64, error) {
	var written int64
	for _, t := range ts {
		lo, hi := max(off, t.chunkOff), min(off+int64(len(block)), t.chunkOff+t.n)
		if lo >= hi {
			continue
		}
		f, err := open.get(t.file)
		if err != nil {
			return written, writeError{err}
		}
		mu := files.at(t.file).writing()
		mu.Lock()
		_, err = f.WriteAt(block[lo-off:hi-off], t.fileOff+lo-t.chunkOff)
		mu.Unlock()
		if err != nil {
			return written, writeError{err}
		}
		if hi > credited {
			written += hi - max(lo, credited)
		}
	}
	return written, nil
}

// newChunkHash returns the hash a fetched chunk is verified with as it is
// written (a sha2x.Digest: streamed chunks are hashed two at a time);
// tests count what it hashes.
var newChunkHash = func() hash.Hash { return sha2x.NewDigest() }

// discard is the hash of bytes that need none: it hashes nothing.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) Sum(b []byte) []byte         { return b }
func (discard) Reset()                      {}
func (discard) Size() int                   { return 0 }
func (discard) BlockSize() int              { return 1 }
