package lazy

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// leadIn is how far a reader must read sequentially into a safetensors or GGUF
// tensor before the volume reads ahead inside it. It absorbs the kernel's
// own readahead, which reads a little past the end of every tensor a loader
// reads.
const leadIn = 1 << 20

// seqSlack is how far from the end of the previous read a read may start and
// still count as sequential (concurrent FUSE reads arrive slightly out of
// order).
const seqSlack = 2 << 20

// File is a regular file of a Volume: an io.ReaderAt over its extents.
type File struct {
	v      *Volume
	e      *layout.File
	idx    int     // index of e in the version's index
	starts []int64 // file offset of each extent

	mu   sync.Mutex
	next int64 // where a sequential read would start
	run  int64 // bytes read sequentially up to next
	// streaming: the reader went on contiguously from one tensor into the
	// next, so it reads whole files (cat, cp, a full load), not one tensor.
	streaming bool
	// whole is the start of the last tensor fetched whole for a read at
	// its start: a read that begins inside that tensor and reaches the
	// next one is its last page (or the kernel's readahead past it), not
	// a read of the next tensor.
	whole   int64
	parsed  bool
	tensors []region // header and tensors of a safetensors or GGUF file, by offset
}

// region is a byte range of a file read as a unit: a safetensors or GGUF header or
// tensor.
type region struct{ begin, end int64 }

var _ io.ReaderAt = (*File)(nil)

// Path returns the file's path in the volume.
func (f *File) Path() string { return f.e.Path }

// Size returns the file's size.
func (f *File) Size() int64 { return f.e.Size }

// ReadAt reads len(p) bytes at off (fewer, with io.EOF, at the end of the
// file). See ReadAtContext.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	return f.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt with a context: it fetches, verifies and caches
// the chunks the range touches (in parallel when there are several), and
// starts reading ahead when reads are sequential. Only verified bytes are
// ever copied into p.
func (f *File) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return f.read(ctx, p, off, true)
}

func (f *File) read(ctx context.Context, p []byte, off int64, ahead bool) (int, error) {
	n, first, err := f.start(ctx, off, len(p), ahead)
	if err != nil {
		return 0, err
	}
	done, err := f.copyOut(ctx, p[:n], off, first)
	if err != nil {
		return done, err
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// start begins a read of size bytes at off: it returns how many bytes the
// file has there and the extent holding off, reads ahead (when ahead is
// set), and starts loading the chunks past the first that the read needs.
func (f *File) start(ctx context.Context, off int64, size int, ahead bool) (n, first int, err error) {
	if off < 0 {
		return 0, 0, fmt.Errorf("%s: negative offset", f.e.Path)
	}
	if off >= f.e.Size {
		return 0, 0, io.EOF
	}
	n = int(min(int64(size), f.e.Size-off))
	first = sort.Search(len(f.starts), func(k int) bool { return f.starts[k] > off }) - 1
	f.noteRead(first, off+int64(n))
	if ahead {
		f.readahead(ctx, off, int64(n))
	}
	// Chunks past the first are loaded in parallel with it: whole, or just
	// the edge the read needs when readahead is not loading them whole.
	for k := first + 1; k < len(f.starts) && f.starts[k] < off+int64(n); k++ {
		x := f.e.Extents[k]
		if !f.v.edgeAhead(x.Chunk, x.Offset, x.Offset+min(x.Length, off+int64(n)-f.starts[k])) {
			f.v.fetchAhead(x.Chunk, 0)
		}
	}
	return n, first, nil
}

// copyOut copies the len(p) bytes at off, which start in extent first,
// into p.
func (f *File) copyOut(ctx context.Context, p []byte, off int64, first int) (int, error) {
	done, n := 0, len(p)
	for k := first; done < n; k++ {
		x := f.e.Extents[k]
		within := off + int64(done) - f.starts[k]
		m := int(min(x.Length-within, int64(n-done)))
		lo := x.Offset + within
		if b, base, ok := f.v.edge(ctx, x.Chunk, lo, lo+int64(m)); ok {
			copy(p[done:done+m], b[lo-base:])
			done += m
			continue
		}
		h, err := f.v.chunk(ctx, x.Chunk)
		if err != nil {
			return done, fmt.Errorf("%s at %d: %w", f.e.Path, off+int64(done), err)
		}
		_, err = h.ch.ReadAt(p[done:done+m], lo)
		f.v.release(h)
		if err != nil {
			return done, fmt.Errorf("%s at %d: chunk %s: %w", f.e.Path, off+int64(done), f.v.ver.Chunk(x.Chunk).Digest, err)
		}
		done += m
	}
	return done, nil
}

// readahead records the read [off, off+n) and, when reads are sequential,
// starts fetching the chunks after it. The window grows with the length of
// the sequential run; in a safetensors or GGUF file it stays inside the current
// tensor until the reader is leadIn bytes into that tensor, and then goes
// at most one chunk past its end, so reading one tensor fetches little else.
func (f *File) readahead(ctx context.Context, off, n int64) {
	if f.v.opt.Readahead < 0 {
		return
	}
	var regions []region
	if hasHeader(f.e.Path) {
		regions = f.regions(ctx)
	}
	end := off + n
	carried := int64(0)
	if off == 0 {
		carried = f.v.takeCarry(f.idx)
	}
	f.mu.Lock()
	seq := f.next > 0 && off <= f.next+seqSlack && off+seqSlack >= f.next
	if carried > 0 && f.next == 0 {
		// The first read of a file right after the reader read the one
		// before it through to its end: the sequential run, and its
		// window, go on from there rather than starting small again.
		seq, f.streaming, f.run, f.next = true, true, carried, 0
	}
	if !seq {
		f.streaming = false
	}
	if seq {
		// A read before the run's start (the kernel sends a sequential
		// reader's requests concurrently, and they may be served in
		// another order) moves the start back: the run began there.
		from := min(off, f.next-f.run)
		f.next = max(end, f.next)
		f.run = f.next - from
	} else {
		f.run, f.next = n, end
	}
	if seq && !f.streaming && len(regions) > 0 && f.next-f.run < regions[0].end && f.next > regions[0].end+leadIn {
		// The run began in the header and went on more than leadIn past
		// it, further than the kernel reads ahead after a header read:
		// the reader reads the file from its start (cat, cp).
		f.streaming = true
	}
	if seq && !f.streaming {
		// On from one tensor into the next, and more than leadIn into it:
		// the reader reads whole files (cat, cp, a full load). Less than
		// leadIn past a tensor's end is the kernel's readahead after a
		// tensor a loader read.
		if cur, ok := regionAt(regions, f.next-1); ok && cur.begin > 0 && f.next-cur.begin > leadIn {
			// The run began in a tensor before this one (not the header),
			// more than leadIn before the page the two share: a fault's
			// read-around, or a read that starts on that shared page, is
			// not a reader going through tensors.
			boundary := cur.begin / pageSize * pageSize
			if prev, ok := regionAt(regions, boundary-1); ok && prev.begin > 0 && f.next-f.run+leadIn <= boundary {
				f.streaming = true
			}
		}
	}
	run, streaming, from := f.run, f.streaming, f.next-f.run
	f.mu.Unlock()
	if r, ok := tensorStart(regions, off, end); ok && !streaming && (off == r.begin || !seq) {
		if cur, ok := regionAt(regions, off); ok && off != r.begin && cur.begin > 0 && cur.begin == f.wholeTensor() {
			// The last page of the tensor being read (its bytes past the
			// tensor come from the next chunk's head edge, already asked
			// for), or the kernel's readahead past it: not a read of the
			// next tensor.
			return
		}
		f.mu.Lock()
		f.whole = r.begin
		f.mu.Unlock()
		// A read at the start of a tensor: loaders read tensors whole, so
		// fetch all of its chunks now, in parallel, not one after another.
		// Through the page cache the last page of a tensor that ends inside
		// a page is read whole, so the page after the tensor is needed too
		// (its chunk's head edge, when it has one).
		to := end + min(f.aheadLimit(end), r.end-end)
		f.fetchChunks(end, min(f.e.Size, to), true)
		if to == r.end && r.end%pageSize != 0 {
			f.fetchPageAfter(r.end)
		}
		return
	}
	if !seq {
		return
	}
	limit := f.aheadLimit(end)
	// The window grows with the sequential run, quickly: a reader that
	// goes on reading gets up to Jobs chunks in flight ahead of it.
	window := min(limit, run*int64(f.v.opt.Jobs))
	// A reader streaming through tensors reads ahead across their
	// boundaries; otherwise readahead stays near the current tensor.
	after := int64(-1)
	if r, ok := regionAt(regions, end-1); ok && !streaming {
		into := min(run, end-r.begin)
		window = min(limit, max(0, into-leadIn))
		if from < r.begin && into > leadIn {
			// The run came in through the region's start (from the
			// header, or from a small tensor) and went leadIn into it:
			// the reader reads this tensor from its start, as a read at
			// its start does, so fetch all of it now.
			window = min(limit, r.end-end)
		}
		if end+window >= r.end {
			window = r.end - end
			if into > leadIn {
				after = r.end // and the page after the region
			}
		}
	}
	f.fetchRange(end, min(f.e.Size, end+window))
	if after >= 0 {
		f.fetchPageAfter(after)
	}
	if (streaming || len(regions) == 0) && run >= leadIn && end+window >= f.e.Size {
		// A reader going through the whole file is likely to read the
		// next one too (cat, cp -r, a loader reading shards in order):
		// once it is within 2*Jobs chunks of the end, the window goes on
		// into the next file as far as it would within this one, so the
		// link stays busy across the boundary (a next file's first Jobs
		// chunks alone, often a header and small tensors, were done long
		// before the reader got there, and the link then idled while it
		// waited for this file's last large chunks).
		left := len(f.starts) - sort.Search(len(f.starts), func(k int) bool { return f.starts[k] > end }) + 1
		if left <= 2*f.v.opt.Jobs {
			f.v.fetchNextFile(f.idx, aheadChunks*f.v.opt.Jobs-left, run)
		}
	}
}

// fetchNextFile starts fetching the first n chunks of the regular file
// after entry i of the index, and carries the reader's sequential run
// (run bytes) over to that file's first read (takeCarry).
func (v *Volume) fetchNextFile(i, n int, run int64) {
	x := v.ver.Index
	for j := i + 1; j < x.Len(); j++ {
		if e := x.File(j); e.Type == layout.TypeFile && e.Size > 0 {
			v.mu.Lock()
			v.carryIdx, v.carryRun = j, run
			v.mu.Unlock()
			for _, x := range e.Extents[:max(0, min(n, len(e.Extents)))] {
				v.fetchAhead(x.Chunk, 0)
			}
			return
		}
	}
}

// takeCarry returns the sequential run carried over to file i from the
// file before it (fetchNextFile), once; 0 when there is none.
func (v *Volume) takeCarry(i int) int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.carryRun == 0 || v.carryIdx != i {
		return 0
	}
	run := v.carryRun
	v.carryRun = 0
	return run
}

// wholeTensor returns the start of the last tensor fetched whole.
func (f *File) wholeTensor() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.whole
}

// aheadChunks is how many times Jobs chunks the default readahead covers:
// Jobs fetches run and three times as many wait behind them, so that the
// link stays busy while the reader waits for the slowest of them. The
// chunks of a checkpoint range from a few KiB to 16 MiB, so the small ones
// after a large one finish first; a window of 2*Jobs chunks ran dry while
// a reader waited for a large chunk.
const aheadChunks = 4

// aheadLimit is the most bytes to read ahead of end: Readahead, or, when
// that was left to its default, the next aheadChunks*Jobs chunks.
func (f *File) aheadLimit(end int64) int64 {
	limit := f.v.opt.Readahead
	if !f.v.autoAhead {
		return limit
	}
	k := sort.Search(len(f.starts), func(k int) bool { return f.starts[k] > end }) - 1
	if k < 0 || k >= len(f.starts) {
		return limit
	}
	last := min(len(f.starts)-1, k+aheadChunks*f.v.opt.Jobs)
	return f.starts[last] + f.e.Extents[last].Length - end
}

// fetchRange starts background fetches of the chunks holding [from, to).
func (f *File) fetchRange(from, to int64) {
	f.fetchChunks(from, to, false)
}

// fetchChunks starts background fetches of the chunks holding [from, to).
// With split (a reader waits for all of them), fewer chunks than Jobs
// share Jobs range requests between them, so that the bytes come over the
// link's Jobs connections, not one connection per chunk.
func (f *File) fetchChunks(from, to int64, split bool) {
	if to <= from {
		return
	}
	first := sort.Search(len(f.starts), func(k int) bool { return f.starts[k] > from }) - 1
	last := first
	for last < len(f.starts) && f.starts[last] < to {
		last++
	}
	parts := 0
	if n := last - first; split && n > 0 {
		parts = f.v.opt.Jobs / n
	}
	ranges := f.v.rangesOK.Load()
	for k := first; k < last; k++ {
		c := f.e.Extents[k].Chunk
		if ranges || f.v.ver.IsDelta(c) {
			// Only once the source has served verified ranges: a reader
			// that joins a background fetch shares its failure, and must
			// not fail where a whole fetch would have served it. A delta
			// chunk's base fetched by ranges is fetched whole when they
			// fail (layout.WithBaseParts): split at once.
			f.v.fetchAhead(c, parts)
		} else {
			f.v.fetchAhead(c, 0)
		}
	}
}

// pageSize is the granularity of the kernel's reads through the page cache.
var pageSize = int64(os.Getpagesize())

// tensorStart returns the tensor that a read of [off, end) starts: one
// beginning at off, or inside the page-aligned read's first page.
func tensorStart(rs []region, off, end int64) (region, bool) {
	if len(rs) > 0 && off < rs[0].end {
		return region{}, false // a read of the header
	}
	i := sort.Search(len(rs), func(i int) bool { return rs[i].begin >= off })
	if i < len(rs) && rs[i].begin > 0 && rs[i].begin < min(end, off+pageSize) {
		return rs[i], true
	}
	return region{}, false
}

// fetchPageAfter starts fetching what holds the page-cache page at off: the
// head edge of its chunk when off is there and the chunk has edges, else
// the whole chunk.
func (f *File) fetchPageAfter(off int64) {
	if off >= f.e.Size {
		return
	}
	k := sort.Search(len(f.starts), func(k int) bool { return f.starts[k] > off }) - 1
	x := f.e.Extents[k]
	lo := x.Offset + off - f.starts[k]
	if f.v.edgeAhead(x.Chunk, lo, min(lo+pageSize, x.Offset+x.Length)) {
		return
	}
	f.fetchRange(off, off+1)
}

// regionAt returns the region holding offset o.
func regionAt(rs []region, o int64) (region, bool) {
	i := sort.Search(len(rs), func(i int) bool { return rs[i].end > o })
	if i < len(rs) && rs[i].begin <= o {
		return rs[i], true
	}
	return region{}, false
}

// hasHeader reports whether a file's name says it starts with a header
// listing its tensors (safetensors, GGUF).
func hasHeader(p string) bool { return tensorheader.IsSafetensors(p) || tensorheader.IsGGUF(p) }

// regions returns the header and tensors of a safetensors or GGUF file,
// parsing the header on first use (fetching its chunks); nil when the
// header does not parse, or could not be fetched this time.
func (f *File) regions(ctx context.Context) []region {
	f.mu.Lock()
	if f.parsed {
		defer f.mu.Unlock()
		return f.tensors
	}
	f.mu.Unlock()
	r := &rawReader{ctx: ctx, f: f}
	var hdr int64
	var ts []tensorheader.Tensor
	var err error
	if tensorheader.IsGGUF(f.e.Path) {
		hdr, ts, err = f.readGGUF(ctx, &extentReader{raw: r})
	} else {
		hdr, ts, err = f.readHeader(ctx, &headReader{raw: r})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.parsed {
		return f.tensors
	}
	if err != nil {
		if r.failed || ctx.Err() != nil {
			return nil // a fetch failure: try again on a later read
		}
		f.parsed = true
		return nil
	}
	rs := []region{{0, hdr}}
	for _, t := range ts {
		if t.End > t.Begin {
			rs = append(rs, region{t.Begin, t.End})
		}
	}
	f.tensors, f.parsed = rs, true
	return rs
}

// readHeader reads and parses the safetensors header of f through r. It
// refuses headers longer than maxHeaderBytes after reading their length,
// and waits until the header's length fits the volume's header budget
// before reading the rest, so headers never claim more memory than
// headerBudget together.
func (f *File) readHeader(ctx context.Context, r io.ReaderAt) (int64, []tensorheader.Tensor, error) {
	n, err := tensorheader.SafetensorsHeaderLen(r, f.e.Size)
	if err != nil {
		return 0, nil, err
	}
	if n > maxHeaderBytes {
		return 0, nil, fmt.Errorf("%s: %w: %d bytes, the limit is %d", f.e.Path, tensorheader.ErrHeaderTooLarge, n, maxHeaderBytes)
	}
	if err := f.v.headers.Acquire(ctx, n); err != nil {
		return 0, nil, err
	}
	defer f.v.headers.Release(n)
	return tensorheader.ReadSafetensorsHeaderMax(r, f.e.Size, maxHeaderBytes)
}

// ggufParseBytes is what one GGUF header parse counts against the header
// budget: the parser reads through a small buffer and keeps only the
// tensor records, so at most two parse at once, whatever their headers.
const ggufParseBytes = headerBudget / 2

// readGGUF reads and parses the GGUF header of f through r (header, tensor
// records and the padding to the data, at most tensorheader.GGUFHeaderLimit
// bytes), waiting for its share of the volume's header budget. The header
// is the first region; each tensor runs to the next one's start, its
// alignment padding with it, as the file's chunks are cut.
func (f *File) readGGUF(ctx context.Context, r io.Reader) (int64, []tensorheader.Tensor, error) {
	if err := f.v.headers.Acquire(ctx, ggufParseBytes); err != nil {
		return 0, nil, err
	}
	defer f.v.headers.Release(ggufParseBytes)
	h, err := tensorheader.ReadGGUFHeaderFrom(r, f.e.Size, tensorheader.GGUFHeaderLimit)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", f.e.Path, err)
	}
	return h.DataStart, h.Ranges(f.e.Size), nil
}

// extentReader reads a File from its start as a stream, each read ending
// at the end of the extent it starts in: a parser reading ahead through a
// buffer touches no chunk past the one holding the bytes it needs (a GGUF
// file is cut at the end of its header, so parsing the header fetches
// none of its tensors).
type extentReader struct {
	raw *rawReader
	off int64
}

func (e *extentReader) Read(p []byte) (int, error) {
	f := e.raw.f
	if e.off >= f.e.Size {
		return 0, io.EOF
	}
	k := sort.Search(len(f.starts), func(k int) bool { return f.starts[k] > e.off }) - 1
	if end := f.starts[k] + f.e.Extents[k].Length; int64(len(p)) > end-e.off {
		p = p[:end-e.off]
	}
	n, err := e.raw.ReadAt(p, e.off)
	e.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// headProbe is how many bytes at a safetensors file's start are read at
// once to learn the header's length: most headers are shorter, so their
// length and bytes come in one round trip (their chunk and the head edge
// of the next), not one after the other.
const headProbe = 64 << 10

// headReader serves the first bytes of a file (up to headProbe) from one
// round trip, and reads the rest through raw.
type headReader struct {
	raw  *rawReader
	head []byte
	read bool
}

func (h *headReader) ReadAt(p []byte, off int64) (int, error) {
	if !h.read {
		h.read = true
		h.head = h.raw.f.probe(h.raw.ctx)
	}
	if off >= 0 && off+int64(len(p)) <= int64(len(h.head)) {
		return copy(p, h.head[off:]), nil
	}
	return h.raw.ReadAt(p, off)
}

// probe returns the first bytes of f, up to headProbe: those of its first
// chunk and of the small chunks after it, and, fetched at the same time,
// those in the head edge of the large chunk after them. A large chunk
// without a usable edge is not fetched: the header may need none of it.
// Nil when the chunks could not be read.
func (f *File) probe(ctx context.Context) []byte {
	n := min(headProbe, f.e.Size)
	if len(f.e.Extents) == 0 || n <= 0 {
		return nil
	}
	acc, k := f.e.Extents[0].Length, 1
	for ; k < len(f.e.Extents) && acc < n; k++ {
		x := f.e.Extents[k]
		if f.v.ver.Index.ChunkSize(x.Chunk) > 2*layout.EdgeBytes {
			break
		}
		acc += x.Length
	}
	if acc >= n || k == len(f.e.Extents) {
		return f.probeRead(ctx, min(n, acc))
	}
	x := f.e.Extents[k]
	c := f.v.ver.Index.Chunk(x.Chunk)
	hi := x.Offset + min(x.Length, n-acc)
	if _, ok := f.v.edgeFor(x.Chunk, c, x.Offset, hi); !ok {
		return f.probeRead(ctx, acc)
	}
	type edgeResult struct {
		data []byte
		base int64
		ok   bool
	}
	res := make(chan edgeResult, 1)
	go func() {
		data, base, ok := f.v.edge(ctx, x.Chunk, x.Offset, hi)
		res <- edgeResult{data, base, ok}
	}()
	b := f.probeRead(ctx, acc)
	e := <-res
	if int64(len(b)) < acc || !e.ok {
		return b
	}
	return append(b, e.data[x.Offset-e.base:hi-e.base]...)
}

// probeRead reads the first n bytes of f without readahead; nil on failure.
func (f *File) probeRead(ctx context.Context, n int64) []byte {
	buf := make([]byte, n)
	if m, err := f.read(ctx, buf, 0, false); err == nil || err == io.EOF {
		return buf[:m]
	}
	return nil
}

// rawReader reads a File without readahead, noting read failures.
type rawReader struct {
	ctx    context.Context
	f      *File
	failed bool
}

func (r *rawReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.f.read(r.ctx, p, off, false)
	if err != nil && err != io.EOF {
		r.failed = true
	}
	return n, err
}
