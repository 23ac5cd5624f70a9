package push

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// ErrFileChanged is wrapped when a file changes while it is being pushed.
var ErrFileChanged = errors.New("layout: file changed during push")

// Options configure Push. Zero values select defaults.
type Options struct {
	Params    layout.Params      // chunking parameters; zero means DefaultParams
	MaxLayers int                // layers per manifest; <= 0 means DefaultMaxLayers
	Jobs      int                // concurrent uploads; <= 0 means 8
	Cache     *statcache.Cache   // stat cache; nil disables it
	Counters  *progress.Counters // progress; may be nil
	// Annotations are added to the root manifest (for example the
	// revision a sync sealed); they are part of the version's digest.
	Annotations map[string]string
	// Previous is the version before, if any: a file whose digest the
	// source states (Entry.Digest) and that Previous holds, alone in whole
	// chunks, takes its chunk list from there and is not read (its chunks
	// are read from the source only if the destination lacks them).
	Previous *layout.Index
	// FormatVersion is the format to seal in: 0 means FormatVersion;
	// FormatVersion1 writes the one-blob index (and packs small files with
	// the chunk sizes, as version 1 did).
	FormatVersion int
	// Destination names the repository pushed to (oci.Ref.Repo). With a
	// stat cache and a local source, a push remembers the pieces of the
	// version it sealed beside the stat records (the piece memo), and a
	// later push of the same tree to the same repository reuses each piece
	// whose files all kept their stat keys without looking at them. ""
	// disables the memo.
	Destination string
	// DeltaBase is the version chunks may be stored as deltas against (see
	// MaxDeltaRatio), opened from the destination; nil stores every chunk
	// plain. It is used only in format version 2, which such a version
	// then upgrades to version 3. A push whose every file the stat cache
	// knows reads files for deltas only when the destination lacks the
	// version it seals without them.
	DeltaBase *layout.Index
	// DeltaBaseDir is a local copy of DeltaBase's tree (the directory it
	// was pushed from, say): the bases of deltas are read from its files
	// where they verify, not fetched. Optional.
	DeltaBaseDir Source
}

// Result describes a pushed version.
type Result struct {
	Root      ocispec.Descriptor
	RootBytes []byte // the root manifest or index, for tagging
	// Index is the version's file index; nil when the push had a
	// destination (Options.Destination) and reused pieces of the
	// version before, which it does not hold, or sealed a version of
	// many files piece by piece.
	Index          *layout.Index
	Files          int   // index entries
	Bytes          int64 // file bytes
	Chunks         int
	ChunksUploaded int64
	BytesUploaded  int64 // chunk and metadata bytes actually uploaded
	Existed        bool  // the version was already stored
	// PiecesReused are the index pieces taken from the version before
	// unchanged (the piece memo), not built or stored again; PiecesBuilt
	// the others.
	PiecesReused, PiecesBuilt int
	// DeltaChunks are the chunks stored as deltas, DeltaPlainBytes their
	// bytes and DeltaBytes the bytes of their delta blobs uploaded.
	DeltaChunks                 int
	DeltaPlainBytes, DeltaBytes int64
	// BaseBytesLocal are the base version's bytes read from
	// Options.DeltaBaseDir to make deltas, BaseBytesFetched those fetched
	// from the destination.
	BaseBytesLocal, BaseBytesFetched int64
	// ChunkBytesUploaded are the bytes of chunks uploaded plain.
	ChunkBytesUploaded int64
}

// section is a run of a file of the source.
type section struct {
	path   string // slash path in the source
	off, n int64
}

// chunkJob is a chunk to store: its bytes (for remote sources) or where
// they are in the source.
type chunkJob struct {
	layout.Chunk
	src  []section
	data []byte
	held *semaphore.Weighted // what data holds of, when not the uploader's buffer
}

// fileChunks is the result of chunking one regular file, held for every
// file until the index is built: its SHA-256 as bytes (not as a digest
// string), and its extents.
type fileChunks struct {
	sum     [sha256.Size]byte
	extents []extentRef
}

// digest returns the file's digest.
func (r *fileChunks) digest() digest.Digest { return layout.SHA256Digest(&r.sum) }

// extentRef is a run of a chunk; the files of one pack share its Chunk.
type extentRef struct {
	chunk       *layout.Chunk
	off, length int64
}

// fileSum returns the SHA-256 of a file's digest d, or an error naming
// the file when d is not a sha256 digest.
func fileSum(path string, d digest.Digest) ([sha256.Size]byte, error) {
	sum, ok := layout.SHA256Sum(d)
	if !ok {
		return sum, layout.Invalid("%q: bad digest %q", path, d)
	}
	return sum, nil
}

// Push chunks the tree of src, uploads the chunks dst lacks, and stores
// the sealed version. It does not tag: the caller tags the returned root.
func Push(ctx context.Context, dst content.Storage, src Source, opt Options) (*Result, error) {
	if opt.Params == (layout.Params{}) {
		opt.Params = layout.DefaultParams
	}
	switch opt.FormatVersion {
	case 0:
		opt.FormatVersion = layout.FormatVersion
	case layout.FormatVersion:
	case layout.FormatVersion1:
		opt.Params.Pack = 0
	default:
		return nil, fmt.Errorf("layout: unsupported format version %d", opt.FormatVersion)
	}
	if err := opt.Params.Validate(); err != nil {
		return nil, err
	}
	if opt.Jobs <= 0 {
		opt.Jobs = 8
	}
	if opt.Counters == nil {
		opt.Counters = &progress.Counters{}
	}
	entries, err := walkOf(ctx, src)
	if err != nil {
		return nil, err
	}
	b := &builder{opt: opt, src: src, entries: entries, results: make([]fileChunks, entries.len())}
	if opt.Cache != nil {
		b.read = make([]bool, entries.len())
		opt.Cache.SetFresh(b.freshRecords)
	}
	defer func() { b.spill.Close() }()
	if r, ok := src.(Remote); ok && r.Remote() {
		b.buffer = semaphore.NewWeighted(bufferBudget)
	} else {
		b.packHeld = semaphore.NewWeighted(packHeldBudget)
	}
	for i := range entries.len() {
		if entries.kind(i) == layout.TypeFile {
			opt.Counters.Total.Add(entries.size[i])
		}
	}
	opt.Cache.Prune(func(p string) bool {
		i := entries.find(p)
		return i >= 0 && entries.kind(i) == layout.TypeFile
	})

	up := &uploader{dst: dst, src: src, seen: map[digest.Digest]bool{}, counters: opt.Counters, buffer: b.buffer}
	if b.last = b.usableMemo(ctx, dst); b.last != nil {
		// The version before is stored, so are its chunks.
		up.stored = b.last.ChunkSet()
	}
	allHit := true
	for i := range entries.len() {
		if e := entries.at(i); e.Type == layout.TypeFile {
			if _, ok := opt.Cache.Lookup(e.Path, e.Stat); !ok {
				allHit = false
				break
			}
		}
	}
	if !allHit {
		if opt.DeltaBase != nil && opt.FormatVersion == layout.FormatVersion {
			up.delta = newDeltaBase(opt.DeltaBase, dst, src, opt.DeltaBaseDir, opt.Params.Min, func(p string) int64 {
				if i := entries.find(p); i >= 0 {
					return entries.size[i]
				}
				return -1
			})
		}
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
	s0, err := b.sealed()
	if err != nil {
		return nil, err
	}
	s := s0
	var kept map[digest.Digest]layout.Delta
	deltas := opt.DeltaBase != nil && opt.FormatVersion == layout.FormatVersion
	if deltas {
		// Nothing was read to seal, so no delta was made: a chunk the
		// base version stores as a delta stays that delta (a re-push of
		// the tree seals the version it sealed before).
		kept = map[digest.Digest]layout.Delta{}
		for _, c := range s.Chunks {
			if d, ok := opt.DeltaBase.DeltaOf(c.Digest); ok {
				kept[c.Digest] = d
			}
		}
		if s, err = s0.WithDeltas(kept, opt.MaxLayers, opt.Annotations); err != nil {
			return nil, err
		}
	}
	if ok, err := dst.Exists(ctx, s.Root.Desc); err == nil && ok {
		opt.Counters.Processed.Store(opt.Counters.Total.Load())
		if err := opt.Cache.Save(); err != nil {
			return nil, fmt.Errorf("save stat cache: %w", err)
		}
		return b.result(s, up, 0, true), nil
	}
	if deltas {
		// Not stored (another repository, another base): the chunks the
		// destination lacks may still be stored as deltas, read now.
		up.delta = newDeltaBase(opt.DeltaBase, dst, src, opt.DeltaBaseDir, opt.Params.Min, func(p string) int64 {
			if i := entries.find(p); i >= 0 {
				return entries.size[i]
			}
			return -1
		})
	}
	err = up.run(ctx, opt.Jobs, func(ctx context.Context, submit func(chunkJob) error) error {
		for _, j := range b.pending {
			if _, ok := kept[j.Digest]; ok {
				continue // stored as the base version's delta
			}
			if err := submit(j); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if up.delta != nil && len(up.delta.deltas) > 0 {
		for c, d := range kept {
			up.delta.deltas[c] = d
		}
		if s, err = s0.WithDeltas(up.delta.deltas, opt.MaxLayers, opt.Annotations); err != nil {
			return nil, err
		}
	}
	return b.store(ctx, dst, s, up)
}

// walkOf returns the walk of src, compactly.
func walkOf(ctx context.Context, src Source) (*walkList, error) {
	if c, ok := src.(compactWalker); ok {
		return c.walkList(ctx)
	}
	es, err := src.Walk(ctx)
	if err != nil {
		return nil, err
	}
	return newWalkList(es)
}

// bufferBudget bounds the chunk bytes held in memory for remote sources.
const bufferBudget = 128 << 20

// packHeldBudget bounds the packs a local push holds for the uploader.
const packHeldBudget = 32 << 20

type builder struct {
	opt    Options
	src    Source
	buffer *semaphore.Weighted // non-nil: keep chunk bytes in memory
	// packHeld bounds the packs of small files a local push keeps, as it
	// read them, until they are uploaded: not read a second time.
	packHeld *semaphore.Weighted
	entries  *walkList
	results  []fileChunks // by entry index
	// last is the piece memo of the version before, when it may be used;
	// memo is the memo of the version sealed, when sealReusing built it.
	last, memo *statcache.PieceMemo

	collect bool
	mu      sync.Mutex
	pending []chunkJob

	prevOnce sync.Once
	prev     map[digest.Digest]int // files of opt.Previous by digest

	spill *layout.Spill // the encoded index pieces, when not in memory
	// read marks the files this push read and hashed: their stat records
	// are written from entries and results when the stat cache is saved.
	read []bool
}

// freshRecords yields the stat records of the files the push read, in
// path order (the walk's).
func (b *builder) freshRecords(yield func(statcache.FreshRecord) bool) {
	for i, ok := range b.read {
		if !ok {
			continue
		}
		e, r := b.entries.at(i), &b.results[i]
		rec := statcache.FreshRecord{Path: e.Path, Stat: e.Stat, Sum: r.sum}
		if e.Size >= b.opt.Params.Min {
			// A large file's record lists its chunks; a packed one's not.
			rec.Chunks = make([]layout.Chunk, len(r.extents))
			for k, x := range r.extents {
				rec.Chunks[k] = *x.chunk
			}
		}
		if !yield(rec) {
			return
		}
	}
}

// seal builds the index and manifests once every chunk is stored and
// stores them.
func (b *builder) seal(ctx context.Context, dst content.Storage, up *uploader) (*Result, error) {
	s, err := b.sealed()
	if err != nil {
		return nil, err
	}
	if up.delta != nil {
		if s, err = s.WithDeltas(up.delta.deltas, b.opt.MaxLayers, b.opt.Annotations); err != nil {
			return nil, err
		}
	}
	return b.store(ctx, dst, s, up)
}

// sealed seals the version once every file is chunked: from the pieces of
// the version before where they did not change (the piece memo), else
// from the whole index.
func (b *builder) sealed() (*layout.Sealed, error) {
	many := b.opt.FormatVersion == layout.FormatVersion && b.entries.len() >= spillEntries
	if many && b.spill == nil {
		// The encoded pieces of a million files are some 200 MB: written
		// to an unlinked file as they are encoded, read back to upload.
		b.spill = b.spillFile()
	}
	if b.last != nil {
		return b.sealReusing(b.last)
	}
	if many && b.opt.Destination != "" {
		// Piece by piece, as a memo's pieces are checked: the whole
		// index (some 100 MB at a million files) is never built.
		return b.sealReusing(b.newMemo())
	}
	x, err := b.index()
	if err != nil {
		return nil, err
	}
	return layout.SealSpill(x, b.opt.MaxLayers, b.opt.Annotations, b.spill)
}

// spillEntries is the entry count from which a push keeps its encoded index
// pieces in a file, not in memory.
const spillEntries = 1 << 16

// spillFile returns a spill of an unlinked temporary file beside the stat
// cache (else in the temporary directory), or nil (the pieces stay in
// memory) when none can be made.
func (b *builder) spillFile() *layout.Spill {
	dir := ""
	if b.opt.Cache != nil {
		dir = b.opt.Cache.Dir()
		_ = os.MkdirAll(dir, 0o700)
	}
	f, err := os.CreateTemp(dir, layout.ReservedPrefix+"index-*")
	if err != nil {
		return nil
	}
	if os.Remove(f.Name()) != nil {
		f.Close()
		return nil
	}
	return layout.NewSpill(f)
}

// store stores the manifests of s and saves the stat cache.
func (b *builder) store(ctx context.Context, dst content.Storage, s *layout.Sealed, up *uploader) (*Result, error) {
	n, err := s.Store(ctx, dst)
	if err != nil {
		return nil, err
	}
	if err := b.opt.Cache.Save(); err != nil {
		return nil, fmt.Errorf("save stat cache: %w", err)
	}
	return b.result(s, up, n, false), nil
}

func (b *builder) result(s *layout.Sealed, up *uploader, metaBytes int64, existed bool) *Result {
	b.writeMemo(s)
	r := &Result{
		Root:           s.Root.Desc,
		RootBytes:      s.Root.Data,
		Index:          s.Index,
		Files:          s.Files(),
		Bytes:          s.Bytes(),
		Chunks:         len(s.Chunks),
		ChunksUploaded: up.chunks.Load(),
		BytesUploaded:  up.bytes.Load() + metaBytes,
		Existed:        existed,
		PiecesReused:   s.Reused(),
		PiecesBuilt:    len(s.PieceRefs()) - s.Reused(),
	}
	for _, d := range s.Deltas() {
		r.DeltaChunks++
		r.DeltaPlainBytes += d.Size
	}
	if up.delta != nil {
		r.DeltaBytes = up.delta.deltaBytes.Load()
		r.BaseBytesLocal, r.BaseBytesFetched = up.delta.baseLocal.Load(), up.delta.baseRead.Load()
	}
	r.ChunkBytesUploaded = up.bytes.Load() - r.DeltaBytes
	return r
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

// index assembles the file index from the walk and the chunking results,
// in its compact form (a million entries are not held as Files first).
// The chunk table lists chunks in order of first use.
func (b *builder) index() (*layout.Index, error) {
	x, err := b.indexRange(0, b.entries.len())
	if err != nil {
		return nil, err
	}
	if err := x.Validate(); err != nil {
		return nil, err
	}
	return x, x.Compact()
}

// indexRange assembles entries [lo, hi) of the walk as an index, not
// checked.
func (b *builder) indexRange(lo, hi int) (*layout.Index, error) {
	ib := layout.NewIndexBuilder(b.opt.FormatVersion, b.opt.Params, hi-lo)
	var exts []layout.Extent
	for i := lo; i < hi; i++ {
		e := b.entries.at(i)
		f := layout.File{Path: e.Path, Type: e.Type, Mode: e.Mode}
		switch e.Type {
		case layout.TypeSymlink:
			f.Target = e.Target
		case layout.TypeFile:
			r := b.results[i]
			f.Size, f.Digest = e.Size, r.digest()
			exts = exts[:0]
			for _, ex := range r.extents {
				k, err := ib.ChunkNumber(*ex.chunk)
				if err != nil {
					return nil, err
				}
				exts = append(exts, layout.Extent{Chunk: k, Offset: ex.off, Length: ex.length})
			}
			f.Extents = exts
		}
		if err := ib.Add(&f); err != nil {
			return nil, err
		}
	}
	return ib.Index(), nil
}
