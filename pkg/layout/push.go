package layout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/bits"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
)

// ErrFileChanged is wrapped when a file changes while it is being pushed.
var ErrFileChanged = errors.New("layout: file changed during push")

// Counters report the progress of a push or pull; the caller reads them
// while the operation runs. All fields are updated atomically.
type Counters struct {
	Total     atomic.Int64 // bytes of the volume
	Processed atomic.Int64 // bytes hashed (push) or written (pull)
	Sent      atomic.Int64 // bytes uploaded (push) or downloaded (pull)
}

// PushOptions configure Push. Zero values select defaults.
type PushOptions struct {
	Params    Params     // chunking parameters; zero means DefaultParams
	MaxLayers int        // layers per manifest; <= 0 means DefaultMaxLayers
	Jobs      int        // concurrent uploads; <= 0 means 8
	Cache     *StatCache // stat cache; nil disables it
	Counters  *Counters  // progress; may be nil
	// Annotations are added to the root manifest (for example the
	// revision a sync sealed); they are part of the version's digest.
	Annotations map[string]string
}

// PushResult describes a pushed version.
type PushResult struct {
	Root           ocispec.Descriptor
	RootBytes      []byte // the root manifest or index, for tagging
	Index          *Index
	Files          int   // index entries
	Bytes          int64 // file bytes
	Chunks         int
	ChunksUploaded int64
	BytesUploaded  int64 // chunk and metadata bytes actually uploaded
	Existed        bool  // the version was already stored
}

// section is a run of a file of the source.
type section struct {
	path   string // slash path in the source
	off, n int64
}

// chunkJob is a chunk to store: its bytes (for remote sources) or where
// they are in the source.
type chunkJob struct {
	Chunk
	src  []section
	data []byte
}

// fileChunks is the result of chunking one regular file.
type fileChunks struct {
	digest  digest.Digest
	extents []extentRef
}

type extentRef struct {
	chunk       Chunk
	off, length int64
}

// Push chunks the tree of src, uploads the chunks dst lacks, and stores
// the sealed version. It does not tag: the caller tags the returned root.
func Push(ctx context.Context, dst content.Storage, src Source, opt PushOptions) (*PushResult, error) {
	if opt.Params == (Params{}) {
		opt.Params = DefaultParams
	}
	if err := opt.Params.Validate(); err != nil {
		return nil, err
	}
	if opt.Jobs <= 0 {
		opt.Jobs = 8
	}
	if opt.Counters == nil {
		opt.Counters = &Counters{}
	}
	entries, err := src.Walk(ctx)
	if err != nil {
		return nil, err
	}
	b := &builder{opt: opt, src: src, entries: entries, results: make([]fileChunks, len(entries))}
	if r, ok := src.(Remote); ok && r.Remote() {
		b.buffer = semaphore.NewWeighted(bufferBudget)
	}
	keep := make(map[string]bool, len(entries))
	allHit := true
	for _, e := range entries {
		if e.Type == TypeFile {
			opt.Counters.Total.Add(e.Size)
			keep[e.Path] = true
			if _, ok := opt.Cache.lookup(e.Path, e.Stat); !ok {
				allHit = false
			}
		}
	}
	opt.Cache.prune(keep)

	up := &uploader{dst: dst, src: src, seen: map[digest.Digest]bool{}, counters: opt.Counters, buffer: b.buffer}
	if !allHit {
		err := up.run(ctx, opt.Jobs, func(ctx context.Context, submit func(chunkJob) error) error {
			return b.chunkAll(ctx, submit)
		})
		if err != nil {
			return nil, err
		}
		return b.seal(ctx, dst, up)
	}
	// Everything is known without reading: seal first, and skip all uploads
	// when the destination already has this version.
	b.collect = true
	if err := b.chunkAll(ctx, nil); err != nil {
		return nil, err
	}
	b.collect = false
	x, err := b.index()
	if err != nil {
		return nil, err
	}
	s, err := Seal(x, opt.MaxLayers, opt.Annotations)
	if err != nil {
		return nil, err
	}
	if ok, err := dst.Exists(ctx, s.Root.Desc); err == nil && ok {
		opt.Counters.Processed.Store(opt.Counters.Total.Load())
		if err := opt.Cache.Save(); err != nil {
			return nil, fmt.Errorf("save stat cache: %w", err)
		}
		return b.result(s, up, 0, true), nil
	}
	err = up.run(ctx, opt.Jobs, func(ctx context.Context, submit func(chunkJob) error) error {
		for _, j := range b.pending {
			if err := submit(j); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return b.store(ctx, dst, s, up)
}

// bufferBudget bounds the chunk bytes held in memory for remote sources.
const bufferBudget = 128 << 20

type builder struct {
	opt     PushOptions
	src     Source
	buffer  *semaphore.Weighted // non-nil: keep chunk bytes in memory
	entries []Entry
	results []fileChunks // by entry index

	collect bool
	mu      sync.Mutex
	pending []chunkJob
}

// seal builds the index and manifests once every chunk is stored and
// stores them.
func (b *builder) seal(ctx context.Context, dst content.Storage, up *uploader) (*PushResult, error) {
	x, err := b.index()
	if err != nil {
		return nil, err
	}
	s, err := Seal(x, b.opt.MaxLayers, b.opt.Annotations)
	if err != nil {
		return nil, err
	}
	return b.store(ctx, dst, s, up)
}

// store stores the manifests of s and saves the stat cache.
func (b *builder) store(ctx context.Context, dst content.Storage, s *Sealed, up *uploader) (*PushResult, error) {
	n, err := s.Store(ctx, dst)
	if err != nil {
		return nil, err
	}
	if err := b.opt.Cache.Save(); err != nil {
		return nil, fmt.Errorf("save stat cache: %w", err)
	}
	return b.result(s, up, n, false), nil
}

func (b *builder) result(s *Sealed, up *uploader, metaBytes int64, existed bool) *PushResult {
	return &PushResult{
		Root:           s.Root.Desc,
		RootBytes:      s.Root.Data,
		Index:          s.Index,
		Files:          len(s.Index.Files),
		Bytes:          s.Index.Bytes(),
		Chunks:         len(s.Index.Chunks),
		ChunksUploaded: up.chunks.Load(),
		BytesUploaded:  up.bytes.Load() + metaBytes,
		Existed:        existed,
	}
}

func (b *builder) emit(submit func(chunkJob) error, j chunkJob) error {
	if b.collect {
		b.mu.Lock()
		b.pending = append(b.pending, j)
		b.mu.Unlock()
		return nil
	}
	return submit(j)
}

// chunkAll chunks every regular file: large files in parallel, small files
// packed in path order by one goroutine.
func (b *builder) chunkAll(ctx context.Context, submit func(chunkJob) error) error {
	g, ctx := errgroup.WithContext(ctx)
	large := make(chan int)
	workers := max(1, runtime.GOMAXPROCS(0))
	for range workers {
		g.Go(func() error {
			buf := make([]byte, 1<<20)
			for i := range large {
				if err := b.chunkFile(ctx, i, buf, submit); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error { return b.packSmall(ctx, submit) })
	g.Go(func() error {
		defer close(large)
		for i, e := range b.entries {
			if e.Type != TypeFile || e.Size < b.opt.Params.Min {
				continue
			}
			select {
			case large <- i:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	return g.Wait()
}

// chunkFile cuts one large file into chunks and hands each to submit.
func (b *builder) chunkFile(ctx context.Context, i int, buf []byte, submit func(chunkJob) error) error {
	e := b.entries[i]
	path := e.Path
	if c, ok := b.opt.Cache.lookup(e.Path, e.Stat); ok && c.Chunks != nil && b.buffer == nil {
		var off int64
		res := fileChunks{digest: c.Digest}
		for _, ch := range c.Chunks {
			if err := b.emit(submit, chunkJob{Chunk: ch, src: []section{{path, off, ch.Size}}}); err != nil {
				return err
			}
			res.extents = append(res.extents, extentRef{chunk: ch, length: ch.Size})
			off += ch.Size
		}
		b.results[i] = res
		b.opt.Counters.Processed.Add(e.Size)
		return nil
	}
	ra, err := b.src.Open(ctx, path)
	if err != nil {
		return err
	}
	defer ra.Close()
	f := io.NewSectionReader(ra, 0, e.Size+1) // one byte more shows growth
	var cuts []int64
	cdc := true
	if isSafetensors(e.Path) {
		if hdrEnd, ts, err := ReadSafetensorsHeader(ra, e.Size); err == nil {
			// The header says where every tensor is: cut there, and
			// at fixed offsets inside big tensors, with no rolling hash.
			cuts = tensorBoundaries(hdrEnd, ts, e.Size, b.opt.Params)
			cdc = false
		}
	}
	fileHash := sha256.New()
	chunkHash := sha256.New()
	headHash := sha256.New()
	cut := newCutter(b.opt.Params)
	var (
		pos, start int64
		res        fileChunks
		held       []byte // the current chunk's bytes, for remote sources
	)
	emitChunk := func() error {
		n := pos - start
		if n == 0 {
			return nil
		}
		ch := Chunk{Digest: digest.NewDigest(digest.SHA256, chunkHash), Size: n}
		chunkHash.Reset()
		if n >= EdgeMinChunk {
			ch.Head = digest.NewDigest(digest.SHA256, headHash)
			tail := held
			if tail == nil {
				tail = make([]byte, EdgeBytes)
				k, err := ra.ReadAt(tail, start+n-EdgeBytes)
				switch {
				case err == io.EOF && k == len(tail):
				case err == io.EOF:
					return fmt.Errorf("%s: %w", path, ErrFileChanged)
				case err != nil:
					return fmt.Errorf("read %s: %w", path, err)
				}
			}
			ch.Tail = digest.FromBytes(tail[len(tail)-EdgeBytes:])
		}
		headHash.Reset()
		cut.reset()
		res.extents = append(res.extents, extentRef{chunk: ch, length: n})
		job := chunkJob{Chunk: ch, src: []section{{path, start, n}}}
		if b.buffer != nil {
			if err := b.buffer.Acquire(ctx, min(n, bufferBudget)); err != nil {
				return err
			}
			job.data, held = held, nil
		}
		err := b.emit(submit, job)
		start = pos
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := io.ReadFull(f, buf)
		if n > 0 {
			data := buf[:n]
			fileHash.Write(data)
			for len(data) > 0 {
				lim := len(data)
				forced := false
				for len(cuts) > 0 && cuts[0] <= pos {
					cuts = cuts[1:]
				}
				if len(cuts) > 0 && cuts[0]-pos <= int64(lim) {
					lim = int(cuts[0] - pos)
					forced = true
				}
				k, end := lim, false
				if cdc {
					k, end = cut.next(data[:lim])
				}
				chunkHash.Write(data[:k])
				if in := pos - start; in < EdgeBytes {
					headHash.Write(data[:min(int64(k), EdgeBytes-in)])
				}
				if b.buffer != nil {
					held = append(held, data[:k]...)
				}
				pos += int64(k)
				data = data[k:]
				if end || (forced && k == lim) {
					if err := emitChunk(); err != nil {
						return err
					}
				}
			}
			b.opt.Counters.Processed.Add(int64(n))
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read %s: %w", path, rerr)
		}
	}
	if pos != e.Size {
		return fmt.Errorf("%s: %w (size %d, read %d)", path, ErrFileChanged, e.Size, pos)
	}
	if err := emitChunk(); err != nil {
		return err
	}
	res.digest = digest.NewDigest(digest.SHA256, fileHash)
	b.results[i] = res
	chunks := make([]Chunk, len(res.extents))
	for k, x := range res.extents {
		chunks[k] = x.chunk
	}
	b.opt.Cache.store(e.Path, cachedFile{Stat: e.Stat, Digest: res.digest, Chunks: chunks})
	return nil
}

// edgeHasher hashes the head and tail edges of a chunk of known size as
// its bytes go by.
type edgeHasher struct {
	size, pos  int64
	head, tail hash.Hash
}

func newEdgeHasher(size int64) *edgeHasher {
	return &edgeHasher{size: size, head: sha256.New(), tail: sha256.New()}
}

func (e *edgeHasher) Write(p []byte) {
	end := e.pos + int64(len(p))
	if e.pos < EdgeBytes {
		e.head.Write(p[:min(int64(len(p)), EdgeBytes-e.pos)])
	}
	if from := e.size - EdgeBytes; end > from {
		e.tail.Write(p[max(0, from-e.pos):])
	}
	e.pos = end
}

// set records the edges in ch when it is large enough to carry them.
func (e *edgeHasher) set(ch *Chunk) {
	if ch.Size >= EdgeMinChunk {
		ch.Head = digest.NewDigest(digest.SHA256, e.head)
		ch.Tail = digest.NewDigest(digest.SHA256, e.tail)
	}
}

// packSmall packs the files smaller than the minimum chunk size, in path
// order, into chunks whose ends are chosen by the files' own digests, so an
// added or changed file changes only the pack around it.
func (b *builder) packSmall(ctx context.Context, submit func(chunkJob) error) error {
	p := b.opt.Params
	var threshold uint64 = ^uint64(0)
	if p.Avg > p.Min {
		threshold = ^uint64(0) / uint64(p.Avg-p.Min)
	}
	type member struct {
		idx  int
		size int64
		dg   digest.Digest
		data []byte // nil when known from the cache
	}
	var (
		members []member
		size    int64
	)
	closePack := func() error {
		if len(members) == 0 {
			return nil
		}
		key := sha256.New()
		for _, m := range members {
			fmt.Fprintf(key, "%s %d\n", m.dg, m.size)
		}
		keyStr := digest.NewDigest(digest.SHA256, key).String()
		ch, ok := b.opt.Cache.pack(keyStr)
		if !ok || ch.Size != size {
			h := sha256.New()
			edges := newEdgeHasher(size)
			for _, m := range members {
				data := m.data
				if data == nil {
					var err error
					if data, err = b.readSmall(ctx, b.entries[m.idx].Path, m.size); err != nil {
						return err
					}
					if digest.FromBytes(data) != m.dg {
						return fmt.Errorf("%s: %w", b.entries[m.idx].Path, ErrFileChanged)
					}
				}
				h.Write(data)
				edges.Write(data)
			}
			ch = Chunk{Digest: digest.NewDigest(digest.SHA256, h), Size: size}
			edges.set(&ch)
			b.opt.Cache.storePack(keyStr, ch)
		}
		job := chunkJob{Chunk: ch, src: make([]section, len(members))}
		if b.buffer != nil {
			if err := b.buffer.Acquire(ctx, min(size, bufferBudget)); err != nil {
				return err
			}
			job.data = make([]byte, 0, size)
			for _, m := range members {
				job.data = append(job.data, m.data...)
			}
		}
		var off int64
		for k, m := range members {
			job.src[k] = section{b.entries[m.idx].Path, 0, m.size}
			b.results[m.idx] = fileChunks{digest: m.dg, extents: []extentRef{{chunk: ch, off: off, length: m.size}}}
			off += m.size
		}
		members, size = members[:0], 0
		return b.emit(submit, job)
	}
	for i, e := range b.entries {
		if e.Type != TypeFile || e.Size >= p.Min {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		m := member{idx: i, size: e.Size}
		if c, ok := b.opt.Cache.lookup(e.Path, e.Stat); ok && b.buffer == nil {
			m.dg = c.Digest
		} else {
			data, err := b.readSmall(ctx, e.Path, e.Size)
			if err != nil {
				return err
			}
			m.dg, m.data = digest.FromBytes(data), data
			b.opt.Cache.store(e.Path, cachedFile{Stat: e.Stat, Digest: m.dg})
		}
		b.opt.Counters.Processed.Add(e.Size)
		if e.Size == 0 {
			b.results[i] = fileChunks{digest: m.dg}
			continue
		}
		if size > 0 && size+e.Size > p.Max {
			if err := closePack(); err != nil {
				return err
			}
		}
		members = append(members, m)
		size += e.Size
		if size >= p.Min {
			hi, lo := bits.Mul64(uint64(e.Size), threshold)
			if hi > 0 || binary.BigEndian.Uint64(mustHex(m.dg)) < lo {
				if err := closePack(); err != nil {
					return err
				}
			}
		}
	}
	return closePack()
}

func mustHex(d digest.Digest) []byte {
	var out [8]byte
	enc := d.Encoded()
	for i := 0; i < 8 && 2*i+1 < len(enc); i++ {
		out[i] = unhex(enc[2*i])<<4 | unhex(enc[2*i+1])
	}
	return out[:]
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return 0
}

// readSmall reads a whole small file and checks its size.
func (b *builder) readSmall(ctx context.Context, path string, size int64) ([]byte, error) {
	f, err := b.src.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data := make([]byte, size+1)
	n, err := f.ReadAt(data, 0)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(n) != size {
		return nil, fmt.Errorf("%s: %w (size %d, read %d)", path, ErrFileChanged, size, n)
	}
	return data[:n], nil
}

// index assembles the file index from the walk and the chunking results.
// The chunk table lists chunks in order of first use.
func (b *builder) index() (*Index, error) {
	x := &Index{Version: FormatVersion, Chunking: b.opt.Params, Files: make([]File, 0, len(b.entries))}
	pos := map[digest.Digest]int{}
	for i, e := range b.entries {
		f := File{Path: e.Path, Type: e.Type, Mode: e.Mode}
		switch e.Type {
		case TypeSymlink:
			f.Target = e.Target
		case TypeFile:
			r := b.results[i]
			f.Size, f.Digest = e.Size, r.digest
			for _, ex := range r.extents {
				k, ok := pos[ex.chunk.Digest]
				if !ok {
					k = len(x.Chunks)
					pos[ex.chunk.Digest] = k
					x.Chunks = append(x.Chunks, ex.chunk)
				}
				f.Extents = append(f.Extents, Extent{Chunk: k, Offset: ex.off, Length: ex.length})
			}
		}
		x.Files = append(x.Files, f)
	}
	return x, x.Validate()
}

// uploader stores chunks concurrently, each distinct digest once, skipping
// those the destination already has.
type uploader struct {
	dst      content.Storage
	src      Source
	buffer   *semaphore.Weighted // releases the bytes of buffered jobs
	counters *Counters
	mu       sync.Mutex
	seen     map[digest.Digest]bool
	chunks   atomic.Int64
	bytes    atomic.Int64
}

// run calls produce with a submit function and uploads what it submits
// with the given concurrency; it returns when everything is stored.
func (u *uploader) run(ctx context.Context, jobs int, produce func(context.Context, func(chunkJob) error) error) error {
	g, ctx := errgroup.WithContext(ctx)
	queue := make(chan chunkJob, 4*jobs)
	for range jobs {
		g.Go(func() error {
			for j := range queue {
				if err := u.store(ctx, j); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer close(queue)
		return produce(ctx, func(j chunkJob) error {
			u.mu.Lock()
			dup := u.seen[j.Digest]
			u.seen[j.Digest] = true
			u.mu.Unlock()
			if dup {
				u.release(j)
				return nil
			}
			select {
			case queue <- j:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	})
	return g.Wait()
}

// release frees the memory a buffered job holds.
func (u *uploader) release(j chunkJob) {
	if j.data != nil && u.buffer != nil {
		u.buffer.Release(min(j.Size, bufferBudget))
	}
}

// uploadAttempts bounds the upload sessions tried for one chunk.
const uploadAttempts = 3

func (u *uploader) store(ctx context.Context, j chunkJob) error {
	defer u.release(j)
	desc := chunkDescriptor(j.Chunk)
	ok, err := u.dst.Exists(ctx, desc)
	if err != nil {
		return fmt.Errorf("chunk %s: %w", j.Digest, err)
	}
	if ok {
		return nil
	}
	var ra io.ReaderAt
	sa := &sectionsAt{src: u.src, secs: j.src}
	defer sa.Close()
	if j.data != nil {
		ra = bytes.NewReader(j.data)
	} else {
		ra = sa
	}
	// An io.ReaderAt body lets a registry upload retry and resume.
	for attempt := 1; ; attempt++ {
		body := io.NewSectionReader(countingReaderAt{ra, &u.counters.Sent}, 0, j.Size)
		err = u.dst.Push(ctx, desc, body)
		if err == nil || errors.Is(err, errdef.ErrAlreadyExists) {
			break
		}
		if serr := sa.failure(); serr != nil {
			return fmt.Errorf("chunk %s: %w", j.Digest, serr)
		}
		if attempt >= uploadAttempts || ctx.Err() != nil {
			return fmt.Errorf("upload chunk %s: %w", j.Digest, err)
		}
		// Start the upload over in a new session.
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(attempt) * 500 * time.Millisecond):
		}
	}
	if err == nil {
		u.chunks.Add(1)
		u.bytes.Add(j.Size)
	}
	return nil
}

// sectionsAt reads a list of source file sections as one run of bytes,
// opening the file under each read and keeping the last one open.
type sectionsAt struct {
	src  Source
	secs []section

	mu   sync.Mutex
	cur  int // index of the open section, -1 when none
	f    ReadAtCloser
	err  error
	offs []int64 // start of each section in the run
}

// ReadAt reads the run at off.
func (s *sectionsAt) ReadAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.offs == nil {
		s.cur = -1
		var o int64
		for _, sec := range s.secs {
			s.offs = append(s.offs, o)
			o += sec.n
		}
	}
	done := 0
	for done < len(p) {
		at := off + int64(done)
		i := sort.Search(len(s.offs), func(i int) bool { return s.offs[i] > at }) - 1
		if i < 0 || at >= s.offs[i]+s.secs[i].n {
			return done, io.EOF
		}
		if i != s.cur {
			if s.f != nil {
				s.f.Close()
				s.f = nil
			}
			f, err := s.src.Open(context.Background(), s.secs[i].path)
			if err != nil {
				s.err = err
				return done, err
			}
			s.f, s.cur = f, i
		}
		sec := s.secs[i]
		within := at - s.offs[i]
		n := min(int64(len(p)-done), sec.n-within)
		k, err := s.f.ReadAt(p[done:done+int(n)], sec.off+within)
		done += k
		if err != nil && !(err == io.EOF && int64(k) == n) {
			if err == io.EOF {
				err = fmt.Errorf("%s: %w", sec.path, ErrFileChanged)
			}
			s.err = err
			return done, err
		}
	}
	return done, nil
}

func (s *sectionsAt) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close closes the open file.
func (s *sectionsAt) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		return s.f.Close()
	}
	return nil
}

// countingReaderAt counts the bytes read, for progress.
type countingReaderAt struct {
	r io.ReaderAt
	n *atomic.Int64
}

func (c countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}
