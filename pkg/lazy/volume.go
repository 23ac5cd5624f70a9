package lazy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/sha2x"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/origin"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// Options configure a Volume. Zero values select defaults.
type Options struct {
	// Cache holds verified chunks; required.
	Cache *chunkcache.Cache
	// Jobs bounds the background chunk fetches (readahead, prefetch);
	// <= 0 means 8.
	Jobs int
	// Readahead is the most bytes fetched ahead of a sequential reader;
	// 0 means 4*Jobs chunks (aheadChunks), Jobs of them in flight, so that a reader gets
	// the link's aggregate speed; < 0 disables readahead.
	Readahead int64
	// FetchTimeout bounds one chunk fetch; <= 0 means no bound beyond the
	// caller's context.
	FetchTimeout time.Duration
	// OnRead, when set, is told the index of every chunk each read
	// touches, in the order of the read (a profile recorder); it must be
	// fast and safe for concurrent use.
	OnRead func(chunk int)
	// OnClose, when set, is called once by the first Close (the end of
	// what the volume's source serves, origin.Scoped).
	OnClose func()
}

// maxHandles bounds the open chunks a Volume keeps.
const maxHandles = 64

// maxHeaderBytes bounds the safetensors header a Volume reads to learn where
// the tensors are (see tensorheader.SafetensorsHeaderLimit). A longer header is
// not parsed; the file is still read byte by byte.
const maxHeaderBytes = tensorheader.SafetensorsHeaderLimit

// headerBudget bounds the header bytes a Volume reads and parses at once,
// whatever the number of files and background jobs.
const headerBudget = 2 * maxHeaderBytes

// Volume is a sealed version opened for lazy reading. It is safe for
// concurrent use. Close stops its background fetches.
type Volume struct {
	ver *layout.Version
	src content.Fetcher
	opt Options

	// bg is the lifetime of background fetches, cancelled by Close.
	bg     context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}
	// headers bounds the safetensors and GGUF header bytes in flight
	// (headerBudget).
	headers *semaphore.Weighted

	mu      sync.Mutex
	files   map[int]*File
	handles map[int]*handle // open chunks by chunk index
	pending map[int]bool    // chunks being loaded in the background
	edges   map[edgeKey]*edgeCall
	// assembling: files whose backing file is being made (passthrough.go)
	assembling map[int]bool
	// carryIdx is the file a reader that read the one before it to its
	// end is expected to read next, and carryRun that reader's sequential
	// run (file.go, takeCarry); carryRun is 0 when nothing is carried.
	carryIdx int
	carryRun int64

	edgeFailures  atomic.Int32 // edges that failed verification in a row; edges stop at maxEdgeFailures
	splitFailures atomic.Int32 // split fetches that failed in a row; splitting stops at maxEdgeFailures
	rangesOK      atomic.Bool  // the source has served a split fetch
	pairs         sha2x.Pairer // delta chunks decoded at once are hashed two at a time
	replay        replayState  // what the replay loaded, for the page-cache fill (pagecache.go)
	stored        atomic.Int64 // bytes stored in open files' page caches
	autoAhead     bool         // Readahead was 0: read ahead by Jobs chunks

	// fetches counts the requests to the source started, fetching those
	// in flight (counted.go): a backing file is made only while the
	// volume fetches nothing.
	fetches  atomic.Int64
	fetching atomic.Int32
	// reads counts the FUSE READ requests served: a backing file is made
	// in the background only once reads and fetches pause.
	reads atomic.Int64
	// fetched is when (time.Now().UnixNano()) the volume last started or
	// ended a fetch from its source.
	fetched atomic.Int64

	closeOnce sync.Once
}

// touch records a fetch starting or ending now (see fetched).
func (v *Volume) touch() { v.fetched.Store(time.Now().UnixNano()) }

// coldStart reports whether the volume is fetching or has fetched from its
// source since it was opened: a start (cold, or a profile replayed), whose
// opens should not wait while a backing file is copied, however long ago
// its last fetch (a loader reaches a large model's last shards well after
// the replay ends), rather than a warm mount, which fetches nothing.
func (v *Volume) coldStart() bool {
	return v.fetching.Load() > 0 || v.fetched.Load() != 0
}

type handle struct {
	ch   chunkcache.Chunk
	refs int
	gone bool // dropped from handles: close when refs reach 0
}

// Open opens the version whose root is root, reading its manifests and
// index through the cache, and returns it ready for reading.
func Open(ctx context.Context, src content.Fetcher, root ocispec.Descriptor, opt Options) (*Volume, error) {
	if opt.Cache == nil {
		return nil, ErrNoCache
	}
	ver, err := origin.Open(ctx, opt.Cache.Fetcher(src), root)
	if err != nil {
		return nil, err
	}
	return New(ver, src, opt)
}

// New returns a Volume reading the opened version ver from src.
func New(ver *layout.Version, src content.Fetcher, opt Options) (*Volume, error) {
	if opt.Cache == nil {
		return nil, ErrNoCache
	}
	if opt.Jobs <= 0 {
		opt.Jobs = 8
	}
	auto := opt.Readahead == 0
	if auto {
		opt.Readahead = 64 << 20
	}
	v := &Volume{
		ver: ver, opt: opt, autoAhead: auto,
		sem:        make(chan struct{}, opt.Jobs),
		headers:    semaphore.NewWeighted(headerBudget),
		files:      map[int]*File{},
		handles:    map[int]*handle{},
		pending:    map[int]bool{},
		edges:      map[edgeKey]*edgeCall{},
		assembling: map[int]bool{},
	}
	// A delta chunk's base is read through the cache: often the version
	// before, mounted on this node, left it there.
	v.src = v.counted(ver.ChunkSourceBases(src, opt.Cache.Fetcher(src)))
	v.bg, v.cancel = context.WithCancel(context.Background())
	return v, nil
}

// Version returns the opened version.
func (v *Volume) Version() *layout.Version { return v.ver }

// Root returns the descriptor of the version's root.
func (v *Volume) Root() ocispec.Descriptor { return v.ver.Root }

// Close cancels background fetches, waits for them and releases open chunks.
func (v *Volume) Close() error {
	v.cancel()
	v.wg.Wait()
	if v.opt.OnClose != nil {
		v.closeOnce.Do(v.opt.OnClose)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, h := range v.handles {
		h.gone = true
		if h.refs == 0 {
			h.ch.Close()
		}
		delete(v.handles, i)
	}
	return nil
}

// Lookup returns the index of the entry at the slash path p.
func (v *Volume) Lookup(p string) (int, bool) {
	return v.ver.Index.Find(p)
}

// Open returns the regular file at the slash path p.
func (v *Volume) Open(p string) (*File, error) {
	i, ok := v.ver.Index.Find(p)
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return v.File(i)
}

// File returns the regular file at index i of the version's index.
func (v *Volume) File(i int) (*File, error) {
	if i < 0 || i >= v.ver.Index.Len() {
		return nil, fmt.Errorf("lazy: no entry %d", i)
	}
	ev := v.ver.Index.File(i)
	e := &ev
	if e.Type != layout.TypeFile {
		return nil, &fs.PathError{Op: "open", Path: e.Path, Err: errors.New("not a regular file")}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if f, ok := v.files[i]; ok {
		return f, nil
	}
	f := &File{v: v, e: e, idx: i, starts: make([]int64, len(e.Extents))}
	var off int64
	for k, x := range e.Extents {
		f.starts[k] = off
		off += x.Length
	}
	v.files[i] = f
	return f, nil
}

// chunk returns the open chunk k, loading it if needed; release it with
// v.release. A reader waits for it: a large chunk is fetched as several
// concurrent range requests when the source can serve ranges.
func (v *Volume) chunk(ctx context.Context, k int) (*handle, error) {
	return v.load(ctx, k, v.opt.Jobs)
}

// load is chunk, fetching a large chunk as up to parts concurrent range
// requests (parts < 2: whole).
func (v *Volume) load(ctx context.Context, k int, parts int) (*handle, error) {
	v.mu.Lock()
	if h, ok := v.handles[k]; ok {
		h.refs++
		v.mu.Unlock()
		return h, nil
	}
	v.mu.Unlock()
	ctx, cancel := v.fetchContext(ctx)
	defer cancel()
	desc := v.ver.Chunk(k)
	rf, ranged := v.src.(rangeSource)
	if ns, ok := v.src.(interface{ NoSplit() bool }); ok && ns.NoSplit() {
		parts = 1 // a source whose chunks are each one range of a larger blob
	}
	if v.ver.IsDelta(k) {
		// Decoded from its delta: no range of its own. Its base, when it
		// must be fetched, is split as the chunk would be (the chunk is
		// decoded whole); fetched whole (a background fetch), the chunk
		// is decoded as the base streams in and hashed by the cache.
		if parts > 1 && ranged && v.splitFailures.Load() < maxEdgeFailures {
			ctx = layout.WithBaseParts(ctx, parts)
		}
		ctx = v.deltaContext(ctx)
		parts = 1
	}
	if parts > 1 && ranged && desc.Size >= splitMin && v.splitFailures.Load() < maxEdgeFailures && v.edgeFailures.Load() < maxEdgeFailures {
		// The cache verifies the whole chunk before serving any of it.
		ch, err := v.opt.Cache.Load(ctx, splitFetcher{rf, parts, !v.rangesOK.Load()}, desc)
		if err == nil {
			v.splitFailures.Store(0)
			v.rangesOK.Store(true)
			return v.keep(k, ch), nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		v.splitFailures.Add(1) // fetch it whole below
		if errors.Is(err, errors.ErrUnsupported) {
			v.splitFailures.Store(maxEdgeFailures) // no ranges from this source:
			v.edgeFailures.Store(maxEdgeFailures)  // no edges either
		}
	}
	ch, err := v.opt.Cache.Load(ctx, v.src, desc)
	if err != nil {
		return nil, err
	}
	return v.keep(k, ch), nil
}

// deltaContext returns ctx for a load of a delta chunk: decoded whole, it
// is hashed paired with the volume's other decodes; its base, when the
// cache lacks it, is fetched past the cache and not kept there (a read
// waiting for the chunk does not wait for the base to be written too);
// its first fetch streams when its base comes whole from the source (see
// layout.WithStreamedDeltas): the cache hashes it, paired with its other
// fetches, and refuses it unless it is the chunk.
func (v *Volume) deltaContext(ctx context.Context) context.Context {
	return layout.WithStreamedDeltas(layout.WithBasesNotKept(layout.WithHashPairs(ctx, &v.pairs)))
}

// keep adds the loaded chunk k to the open handles, returning it with one
// reference.
func (v *Volume) keep(k int, ch chunkcache.Chunk) *handle {
	if chunkcache.InMemory(ch) {
		// Not stored (disk full): serve this read, keep no memory.
		return &handle{ch: ch, refs: 1, gone: true}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if h, ok := v.handles[k]; ok {
		ch.Close()
		h.refs++
		return h
	}
	if len(v.handles) >= maxHandles {
		for i, h := range v.handles {
			if h.refs == 0 {
				h.gone = true
				h.ch.Close()
				delete(v.handles, i)
				break
			}
		}
	}
	h := &handle{ch: ch, refs: 1}
	v.handles[k] = h
	return h
}

func (v *Volume) release(h *handle) {
	v.mu.Lock()
	defer v.mu.Unlock()
	h.refs--
	if h.refs == 0 && h.gone {
		h.ch.Close()
	}
}

// fetchAhead loads chunk k in the background unless it is open or already
// being loaded, as up to parts concurrent range requests (see load).
func (v *Volume) fetchAhead(k, parts int) {
	v.mu.Lock()
	if _, ok := v.handles[k]; ok || v.pending[k] || v.bg.Err() != nil {
		v.mu.Unlock()
		return
	}
	v.pending[k] = true
	v.wg.Add(1)
	v.mu.Unlock()
	go func() {
		defer v.wg.Done()
		defer func() {
			v.mu.Lock()
			delete(v.pending, k)
			v.mu.Unlock()
		}()
		select {
		case v.sem <- struct{}{}:
		case <-v.bg.Done():
			return
		}
		defer func() { <-v.sem }()
		if h, err := v.load(v.bg, k, parts); err == nil {
			v.release(h)
		}
	}()
}

// PrefetchHeaders fetches and parses the header of every safetensors and
// GGUF file in parallel, as every loader reads them first: a GGUF file's
// header, tensor records and alignment padding (up to
// tensorheader.GGUFHeaderLimit), so that the first read of a tensor finds the
// header's chunks cached and its tensor map parsed.
func (v *Volume) PrefetchHeaders(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(v.opt.Jobs)
	for i := range v.ver.Index.Len() {
		e := v.ver.Index.File(i)
		if e.Type != layout.TypeFile || !hasHeader(e.Path) {
			continue
		}
		g.Go(func() error {
			f, err := v.File(i)
			if err != nil {
				return err
			}
			f.regions(ctx)
			return ctx.Err()
		})
	}
	return g.Wait()
}

// Prefetch fills the cache with the chunks of the regular files for which
// match returns true (all files if match is nil), in the order a loader
// likely reads them: small files such as configs first, then safetensors
// and GGUF files by name, each from its start. It returns the first error after
// trying every chunk.
func (v *Volume) Prefetch(ctx context.Context, match func(path string) bool) error {
	var idx []int
	x := v.ver.Index
	for i := range x.Len() {
		e := x.File(i)
		if e.Type == layout.TypeFile && e.Size > 0 && (match == nil || match(e.Path)) {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool {
		pa, pb := x.Path(idx[a]), x.Path(idx[b])
		if sa, sb := hasHeader(pa), hasHeader(pb); sa != sb {
			return !sa
		}
		return pa < pb
	})
	seen := make(map[int]bool)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(v.opt.Jobs)
	var mu sync.Mutex
	var first error
	for _, i := range idx {
		for _, ext := range x.File(i).Extents {
			if seen[ext.Chunk] {
				continue
			}
			seen[ext.Chunk] = true
			k := ext.Chunk
			g.Go(func() error {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				fctx, cancel := v.fetchContext(gctx)
				defer cancel()
				if v.ver.IsDelta(k) {
					fctx = v.deltaContext(fctx)
				}
				ch, err := v.opt.Cache.Load(fctx, v.src, v.ver.Chunk(k))
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return nil
				}
				return ch.Close()
			})
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return first
}
