package chunkcache

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/sha2x"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Chunk is the verified bytes of one chunk. Close releases it; a Chunk stays
// readable after its cache entry is evicted.
type Chunk interface {
	io.ReaderAt
	io.Closer
}

// DefaultSize bounds a cache opened with a size <= 0.
const DefaultSize = 10 << 30

// tmpMaxAge is how old a temporary file must be before Open removes it
// as the leftover of a crashed writer (a live writer may be using a newer one).
const tmpMaxAge = time.Hour

// Stats count what a Cache did since it was opened.
type Stats struct {
	Hits         int64 // loads served from disk or joined to another load
	HitBytes     int64 // bytes of those loads
	Fetches      int64 // blobs fetched from a Fetcher and verified
	FetchedBytes int64
	Corrupt      int64 // fetched blobs or disk entries that failed verification
	StoreErrors  int64 // verified blobs that could not be written (served uncached)
	Evictions    int64
	// BackingsMade counts backing files assembled (backing.go), and
	// BackingsOpened the opens of backing files, made or found.
	BackingsMade, BackingsOpened int64
}

// Cache is an on-disk, content-addressed cache of verified blobs, bounded by
// size with least-recently-used eviction, shared by every process that opens
// the same directory. It is safe for concurrent use.
//
// Layout: DIR/sha256/HEX holds a verified blob; DIR/tmp holds blobs being
// written. Entries written by other processes are found on disk; the size
// bound is kept by each process over the entries it knows about. An entry
// is served only once verified: one no process vouched for (see vouch.go),
// such as a delta chunk's base kept as it was fetched (Keep), is hashed
// when it is first opened.
//
// A Cache from Open serves every entry to every caller. A view from For
// serves an entry only once its origin has delivered those bytes (see
// origins.go); views share the entries, the bound and the loads in flight.
type Cache struct {
	*store
	origin string // "" for the unscoped cache Open returns
	oid    string // originID(origin)
}

// store is what every view of one opened cache shares.
type store struct {
	dir string
	max int64

	pairs sha2x.Pairer // chunks fetched at once are hashed two at a time

	mu       sync.Mutex
	lru      *list.List // of *cacheEntry, most recently used at the front
	entries  map[digest.Digest]*list.Element
	size     int64
	verified map[digest.Digest]bool // entries this process has hashed
	flight   map[flightKey]*call    // loads in flight, by digest and origin
	// delivered holds, by entry path, the origins (originID) known to have
	// delivered the entry's bytes: read from disk (origins.go) or recorded
	// by this process.
	delivered map[string][]string
	owners    map[string]map[digest.Digest]int64 // protect sets by owner (protect.go)
	pins      map[digest.Digest]int              // how many owners protect each digest
	// backing files (backing.go): in the LRU beside the chunks, by file digest
	backings    map[digest.Digest]*list.Element
	backingOpen map[digest.Digest]int  // open Backings by digest: never evicted
	building    map[digest.Digest]bool // Assemble under way
	// folds lists, by backing file, the chunks this process knows are
	// folded into it (fold.go)
	folds map[digest.Digest][]digest.Digest

	backingsMade, backingsOpened atomic.Int64

	hitBytes                                                     atomic.Int64
	hits, fetches, fetchedBytes, corrupt, storeErrors, evictions atomic.Int64
}

type cacheEntry struct {
	d       digest.Digest
	size    int64
	backing bool // a backing file (backing.go), not a chunk
}

// found is an entry found on disk by Open.
type found struct {
	d       digest.Digest
	size    int64
	mtime   time.Time
	backing bool
}

// call is one in-flight load of a blob; waiters block on done.
type call struct {
	done chan struct{}
	err  error
	mem  []byte // the verified bytes, when they could not be stored
}

// Open opens (creating it if needed) the cache directory dir, bounded
// to maxBytes (DefaultSize if <= 0). It indexes the entries already
// there, oldest use first, evicts down to the bound, and removes temporary
// files left by crashed writers.
func Open(dir string, maxBytes int64) (*Cache, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultSize
	}
	c := &Cache{store: &store{
		dir: dir, max: maxBytes,
		lru:         list.New(),
		entries:     map[digest.Digest]*list.Element{},
		verified:    map[digest.Digest]bool{},
		flight:      map[flightKey]*call{},
		delivered:   map[string][]string{},
		owners:      map[string]map[digest.Digest]int64{},
		pins:        map[digest.Digest]int{},
		backings:    map[digest.Digest]*list.Element{},
		backingOpen: map[digest.Digest]int{},
		building:    map[digest.Digest]bool{},
		folds:       map[digest.Digest][]digest.Digest{},
	}}
	for _, d := range []string{c.blobDir(), c.tmpDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("chunk cache: %w", err)
		}
	}
	if tmps, err := os.ReadDir(c.tmpDir()); err == nil {
		for _, e := range tmps {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > tmpMaxAge {
				os.Remove(filepath.Join(c.tmpDir(), e.Name()))
			}
		}
	}
	des, err := os.ReadDir(c.blobDir())
	if err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	var fs []found
	for _, e := range des {
		d := digest.NewDigestFromEncoded(digest.SHA256, e.Name())
		info, err := e.Info()
		if err != nil || d.Validate() != nil || !info.Mode().IsRegular() {
			continue
		}
		fs = append(fs, found{d: d, size: info.Size(), mtime: info.ModTime()})
	}
	fs = append(fs, c.indexBackings()...)
	c.indexFolds()
	sort.Slice(fs, func(i, j int) bool { return fs[i].mtime.Before(fs[j].mtime) })
	for _, f := range fs {
		el := c.lru.PushFront(&cacheEntry{d: f.d, size: f.size, backing: f.backing})
		if f.backing {
			c.backings[f.d] = el
		} else {
			c.entries[f.d] = el
		}
		c.size += f.size
	}
	c.mu.Lock()
	c.evictLocked(nil)
	c.mu.Unlock()
	return c, nil
}

// Dir returns the cache directory.
func (c *Cache) Dir() string { return c.dir }

// Size returns the bytes of the entries this process knows about.
func (c *Cache) Size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	return Stats{
		Hits: c.hits.Load(), HitBytes: c.hitBytes.Load(), Fetches: c.fetches.Load(), FetchedBytes: c.fetchedBytes.Load(),
		Corrupt: c.corrupt.Load(), StoreErrors: c.storeErrors.Load(), Evictions: c.evictions.Load(),
		BackingsMade: c.backingsMade.Load(), BackingsOpened: c.backingsOpened.Load(),
	}
}

func (c *Cache) blobDir() string { return filepath.Join(c.dir, "sha256") }
func (c *Cache) tmpDir() string  { return filepath.Join(c.dir, "tmp") }
func (c *Cache) path(d digest.Digest) string {
	return filepath.Join(c.blobDir(), d.Encoded())
}

// wellFormed reports whether d is a sha256 digest of 64 hex digits, the
// only kind whose encoded part may be joined into a path of the cache.
func wellFormed(d digest.Digest) bool {
	return d.Validate() == nil && d.Algorithm() == digest.SHA256
}

// Contains reports whether d has an entry on disk (for a view, one its
// origin delivered).
func (c *Cache) Contains(d digest.Digest) bool {
	if !wellFormed(d) {
		return false
	}
	p := c.path(d)
	if _, err := os.Stat(p); err != nil {
		_, ok := c.foldedAt(d)
		return ok
	}
	return c.deliveredAt(p, nil)
}

// cacheable reports whether desc can be held by the cache.
func cacheable(desc ocispec.Descriptor) bool {
	return wellFormed(desc.Digest) &&
		desc.Size >= 0 && desc.Size <= layout.MaxChunkBytes
}

// Load returns the verified bytes of the blob desc: from disk if an entry is
// there (hashed again the first time this process opens it), else fetched
// from src, verified and stored. Concurrent loads of one digest fetch it
// once; a failed or cancelled fetch is not remembered. Bytes that do not
// match desc are never returned or stored: the error is a
// *ChunkInvalidError. If a verified blob cannot be stored (disk full), it is
// still returned, from memory.
func (c *Cache) Load(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (Chunk, error) {
	if !cacheable(desc) {
		return nil, fmt.Errorf("chunk %s: cannot cache a blob of %d bytes", desc.Digest, desc.Size)
	}
	for {
		ch, err := c.open(desc)
		if err != nil {
			return nil, err
		}
		if ch != nil {
			c.hits.Add(1)
			c.hitBytes.Add(desc.Size)
			return ch, nil
		}
		c.mu.Lock()
		key := flightKey{desc.Digest, c.oid}
		if cl, ok := c.flight[key]; ok {
			c.mu.Unlock()
			select {
			case <-cl.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			switch {
			case cl.err == nil && cl.mem != nil:
				c.hits.Add(1)
				c.hitBytes.Add(desc.Size)
				return memChunk{bytes.NewReader(cl.mem)}, nil
			case cl.err == nil:
				continue // on disk now
			case errors.Is(cl.err, context.Canceled) || errors.Is(cl.err, context.DeadlineExceeded):
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				continue // the other caller gave up; try ourselves
			default:
				return nil, cl.err
			}
		}
		cl := &call{done: make(chan struct{})}
		c.flight[key] = cl
		c.mu.Unlock()

		// A load that ended between the look at the disk above and the
		// flight just registered has stored the blob: use it.
		ch, err = c.open(desc)
		var mem []byte
		if ch == nil && err == nil {
			ch, mem, err = c.fetch(ctx, src, desc)
		} else if ch != nil {
			c.hits.Add(1)
			c.hitBytes.Add(desc.Size)
		}
		cl.err, cl.mem = err, mem
		c.mu.Lock()
		delete(c.flight, key)
		c.mu.Unlock()
		close(cl.done)
		return ch, err
	}
}

// Has reports whether d is stored (for a view, delivered by its origin) or
// being fetched (for a view, from its origin).
func (c *Cache) Has(d digest.Digest) bool {
	c.mu.Lock()
	_, fl := c.flight[flightKey{d, c.oid}]
	c.mu.Unlock()
	return fl || c.Contains(d)
}

// open returns the disk entry of desc, or nil when there is none usable
// (for a view, none its origin delivered: such an entry is kept, and the
// caller's fetch from the origin replaces it, see origins.go).
// An entry whose bytes match desc.Digest but not desc.Size shows that desc
// is wrong, not the entry: the entry is kept and the error wraps
// ErrWrongSize.
func (c *Cache) open(desc ocispec.Descriptor) (Chunk, error) {
	p := c.path(desc.Digest)
	f, err := os.Open(p)
	if err != nil {
		c.forget(desc.Digest)
		if ch := c.openFolded(desc); ch != nil {
			return ch, nil
		}
		return nil, nil
	}
	st, err := f.Stat()
	if err == nil && st.Size() != desc.Size {
		good := c.intact(f, st, desc.Digest)
		f.Close()
		if good {
			return nil, fmt.Errorf("chunk %s: the volume says %d bytes, the verified cache entry has %d: %w",
				desc.Digest, desc.Size, st.Size(), ErrWrongSize)
		}
		c.corrupt.Add(1)
		c.dropDamaged(desc.Digest, st)
		return nil, nil
	}
	if err != nil {
		f.Close()
		c.drop(desc.Digest)
		return nil, nil
	}
	c.mu.Lock()
	checked := c.verified[desc.Digest]
	c.mu.Unlock()
	if !checked && vouchedEntry(f, st) {
		checked = true // hashed when it was stored, unchanged since
	}
	if !checked {
		h := newHash()
		if n, err := io.Copy(h, io.NewSectionReader(f, 0, desc.Size)); err != nil || verify.Digest("chunk", desc, digest.NewDigest(digest.SHA256, h), n) != nil {
			f.Close()
			c.corrupt.Add(1)
			c.dropDamaged(desc.Digest, st)
			return nil, nil
		}
		now := time.Now()
		os.Chtimes(p, now, now) // the on-disk LRU order other processes start from
		vouchEntry(p)
	}
	if !c.deliveredAt(p, f) {
		f.Close()
		// The origin may have delivered the chunk before it was folded
		// and fetched again by another.
		if ch := c.openFolded(desc); ch != nil {
			return ch, nil
		}
		return nil, nil
	}
	c.mu.Lock()
	c.verified[desc.Digest] = true
	if el, ok := c.entries[desc.Digest]; ok {
		c.lru.MoveToFront(el)
	} else {
		c.entries[desc.Digest] = c.lru.PushFront(&cacheEntry{d: desc.Digest, size: desc.Size})
		c.size += desc.Size
		c.evictLocked(c.entries[desc.Digest])
	}
	c.mu.Unlock()
	return f, nil
}

// intact reports whether the entry f (with stat st) holds the bytes of d:
// this process hashed it, or it carries a valid mark (vouch.go), or hashing it now
// matches. Entries larger than any chunk are not hashed.
func (c *Cache) intact(f *os.File, st os.FileInfo, d digest.Digest) bool {
	c.mu.Lock()
	checked := c.verified[d]
	c.mu.Unlock()
	if checked || vouchedEntry(f, st) {
		return true
	}
	if !st.Mode().IsRegular() || st.Size() > layout.MaxChunkBytes {
		return false
	}
	h := newHash()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, st.Size())); err != nil {
		return false
	}
	return digest.NewDigest(digest.SHA256, h) == d
}

// forget removes d from the accounting (its file is gone).
func (c *Cache) forget(d digest.Digest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[d]; ok {
		c.size -= el.Value.(*cacheEntry).size
		c.lru.Remove(el)
		delete(c.entries, d)
	}
	delete(c.verified, d)
	delete(c.delivered, c.path(d))
}

// dropDamaged drops the entry of d found damaged, with stat st, unless
// another loader has replaced it since with a good one: a slow check must
// not remove the entry a faster loader just fetched again.
func (c *Cache) dropDamaged(d digest.Digest, st os.FileInfo) {
	if cur, err := os.Stat(c.path(d)); err == nil && !os.SameFile(cur, st) {
		return
	}
	c.drop(d)
}

// drop removes the entry of d from disk and from the accounting.
func (c *Cache) drop(d digest.Digest) {
	os.Remove(c.path(d))
	c.forget(d)
}

// evictLocked removes least recently used entries, never keep, until the
// cache fits its bound: first entries no owner protects (protect.go), then,
// only when protected entries alone exceed the bound, protected ones.
func (c *Cache) evictLocked(keep *list.Element) {
	for _, protectedToo := range []bool{false, true} {
		for el := c.lru.Back(); el != nil && c.size > c.max; {
			prev := el.Prev()
			if e := el.Value.(*cacheEntry); el != keep && c.evictable(e, protectedToo) {
				c.size -= e.size
				c.lru.Remove(el)
				if e.backing {
					c.dropFoldsLocked(e.d)
					os.Remove(c.backingPath(e.d))
					delete(c.backings, e.d)
					delete(c.delivered, c.backingPath(e.d))
				} else {
					os.Remove(c.path(e.d))
					delete(c.entries, e.d)
					delete(c.verified, e.d)
					delete(c.delivered, c.path(e.d))
				}
				c.evictions.Add(1)
			}
			el = prev
		}
	}
}

// fetch fetches desc from src and verifies it, streaming it into a new
// cache entry as it arrives; the entry gets its name only once verified.
// When the entry cannot be written (disk full), the blob is fetched again
// into memory and returned from there, with mem set to its bytes for the
// callers waiting on the same load.
// A source whose reader fails with a *RefetchError is replaced by its
// Next, up to maxRefetches times.
func (c *Cache) fetch(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (ch Chunk, mem []byte, err error) {
	for range maxRefetches {
		ch, mem, err = c.fetchFrom(ctx, src, desc)
		var re *RefetchError
		if err == nil || !errors.As(err, &re) || re.Next == nil || ctx.Err() != nil {
			return ch, mem, err
		}
		src = re.Next
	}
	return ch, mem, err
}

// fetchFrom is fetch from one source.
func (c *Cache) fetchFrom(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (ch Chunk, mem []byte, err error) {
	f, err := os.CreateTemp(c.tmpDir(), desc.Digest.Encoded()+"-*")
	if err == nil {
		if err = reserve(f, desc.Size); err == nil {
			ch, err := c.fetchToFile(ctx, src, desc, f)
			var se *storeError
			if !errors.As(err, &se) {
				return ch, nil, err
			}
		} else {
			f.Close()
			os.Remove(f.Name())
		}
	}
	c.storeErrors.Add(1)
	b, err := c.fetchToMemory(ctx, src, desc)
	if err != nil {
		return nil, nil, err
	}
	return memChunk{bytes.NewReader(b)}, b, nil
}

// storeError is a failure to write a cache entry.
type storeError struct{ err error }

func (e *storeError) Error() string { return "cache write: " + e.err.Error() }

// fetchToFile streams desc into the temporary file f, verifies it and
// renames it into place. f is closed or returned as the chunk.
func (c *Cache) fetchToFile(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, f *os.File) (Chunk, error) {
	keep := false
	defer func() {
		if !keep {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", desc.Digest, err)
	}
	defer rc.Close()
	if ck := verify.CheckedOf(rc); ck.Vouches(desc) {
		// Verified by a decoder (a delta chunk): stored as it is, not
		// hashed again.
		if _, err := f.Write(ck.Bytes()); err != nil {
			return nil, &storeError{err}
		}
		c.fetches.Add(1)
		c.fetchedBytes.Add(desc.Size)
	} else {
		n, got, err := copyHashed(f, rc, desc.Size, &c.pairs)
		if err != nil {
			return nil, c.readError(desc, n, err)
		}
		if err := c.checkFetched(desc, rc, got); err != nil {
			return nil, err
		}
	}
	p := c.path(desc.Digest)
	c.deliver(f, p)
	if err := os.Rename(f.Name(), p); err != nil {
		return nil, &storeError{err}
	}
	vouchEntry(p)
	c.added(desc)
	keep = true
	return f, nil
}

// fetchToMemory fetches desc into memory and verifies it.
func (c *Cache) fetchToMemory(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) ([]byte, error) {
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", desc.Digest, err)
	}
	defer rc.Close()
	buf := make([]byte, desc.Size)
	if ck := verify.CheckedOf(rc); ck.Vouches(desc) {
		copy(buf, ck.Bytes()) // verified by a decoder: not hashed again
		c.fetches.Add(1)
		c.fetchedBytes.Add(desc.Size)
		return buf, nil
	}
	h := newHash()
	n, err := io.ReadFull(io.TeeReader(rc, h), buf)
	if err != nil {
		return nil, c.readError(desc, int64(n), err)
	}
	if err := c.checkFetched(desc, rc, digest.NewDigest(digest.SHA256, h)); err != nil {
		return nil, err
	}
	return buf, nil
}

// readError describes a fetch that stopped after n bytes.
func (c *Cache) readError(desc ocispec.Descriptor, n int64, err error) error {
	var se *storeError
	var re *RefetchError
	if errors.As(err, &se) || errors.As(err, &re) {
		return err
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		c.corrupt.Add(1)
		return verify.Digest("chunk", desc, "", n)
	}
	return fmt.Errorf("chunk %s: read after %d of %d bytes: %w", desc.Digest, n, desc.Size, err)
}

// checkFetched checks that rc has nothing past desc.Size and that got is
// desc's digest.
func (c *Cache) checkFetched(desc ocispec.Descriptor, rc io.Reader, got digest.Digest) error {
	if err := verify.End("chunk", desc, rc, got, desc.Size); err != nil {
		c.corrupt.Add(1)
		return err
	}
	c.fetches.Add(1)
	c.fetchedBytes.Add(desc.Size)
	return nil
}

// newHash returns the hash fetched blobs and entries are verified with;
// tests count what it hashes.
var newHash = sha256.New

// piece is the unit copyHashed reads, hashes and writes at once.
const piece = 256 << 10

var pieces = sync.Pool{New: func() any { return new([2 * piece]byte) }}

// newFetchHash returns the hash a fetched chunk is verified with as it is
// stored (a sha2x.Digest, hashed beside other fetches); tests count what it
// hashes.
var newFetchHash = func() hash.Hash { return sha2x.NewDigest() }

// copyHashed copies size bytes from r to w and returns the SHA-256 of what
// it read. Each piece is read, hashed and written by the calling goroutine:
// a fetch's pieces arrive slower than they are hashed and stored, and
// background fetches run several at a time, so handing pieces between
// goroutines would only add context switches. Two pieces alternate: one is
// offered to pairs, to be hashed beside another fetch's piece (SHA-256
// twice for about the cost of once), while it is written and the next one
// read. A write failure is returned as a *storeError.
func copyHashed(w io.Writer, r io.Reader, size int64, pairs *sha2x.Pairer) (int64, digest.Digest, error) {
	b := pieces.Get().(*[2 * piece]byte)
	defer pieces.Put(b)
	h := newFetchHash()
	hs := pairs.Stream(h)
	defer hs.Wait() // nothing hashes b after a return
	var n int64
	for k := 0; n < size; k ^= 1 {
		half := b[k*piece : (k+1)*piece]
		got, err := io.ReadFull(r, half[:min(int64(piece), size-n)])
		n += int64(got)
		if got > 0 {
			hs.Write(half[:got])
			if _, werr := w.Write(half[:got]); werr != nil {
				return n, "", &storeError{werr}
			}
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return n, "", err
		}
	}
	hs.Wait()
	return n, digest.NewDigest(digest.SHA256, h), nil
}

// added accounts for the new entry of desc, evicting as needed.
func (c *Cache) added(desc ocispec.Descriptor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.verified[desc.Digest] = true
	if el, ok := c.entries[desc.Digest]; ok {
		c.lru.MoveToFront(el)
		return
	}
	el := c.lru.PushFront(&cacheEntry{d: desc.Digest, size: desc.Size})
	c.entries[desc.Digest] = el
	c.size += desc.Size
	c.evictLocked(el)
}

// memChunk is a Chunk held in memory.
type memChunk struct{ *bytes.Reader }

func (memChunk) Close() error { return nil }

// InMemory reports whether ch is held in memory only, not in the cache (the
// disk was full when it was loaded): keep it no longer than a read needs.
func InMemory(ch Chunk) bool {
	_, ok := ch.(memChunk)
	return ok
}

// Fetcher returns a Fetcher that serves blobs from the cache, fetching
// missing ones from src (for example to let `bdnvol pull` reuse chunks a
// mount fetched). Blobs the cache cannot hold are fetched from src and
// verified as they are read.
func (c *Cache) Fetcher(src content.Fetcher) content.Fetcher { return &cachedFetcher{c: c, src: src} }

type cachedFetcher struct {
	c   *Cache
	src content.Fetcher
}

// Local reports whether the wrapped source reads local files.
func (f *cachedFetcher) Local() bool { return isLocal(f.src) }

// Origin returns the origin of the cache view the fetcher reads through.
func (f *cachedFetcher) Origin() string { return f.c.origin }

// isLocal reports whether src reads local files (implements Local() bool
// returning true): fetching again does not cure a bad blob.
func isLocal(src any) bool {
	l, ok := src.(interface{ Local() bool })
	return ok && l.Local()
}

func (f *cachedFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if !cacheable(desc) {
		rc, err := f.src.Fetch(ctx, desc)
		if err != nil {
			return nil, err
		}
		return struct {
			io.Reader
			io.Closer
		}{verify.Reader(rc, "blob", desc), rc}, nil
	}
	ch, err := f.c.Load(ctx, f.src, desc)
	if err != nil {
		return nil, err
	}
	return &chunkReadCloser{SectionReader: io.NewSectionReader(ch, 0, desc.Size), ch: ch}, nil
}

type chunkReadCloser struct {
	*io.SectionReader
	ch Chunk
}

func (r *chunkReadCloser) Close() error { return r.ch.Close() }

// FetchCached returns the blob desc from the cache (verified, as Fetch
// serves it) when the cache holds it, and ok false, fetching nothing, when
// it does not.
func (f *cachedFetcher) FetchCached(ctx context.Context, desc ocispec.Descriptor) (rc io.ReadCloser, ok bool, err error) {
	if !cacheable(desc) {
		return nil, false, nil
	}
	ch, err := f.c.open(desc)
	if err != nil || ch == nil {
		return nil, false, err
	}
	f.c.hits.Add(1)
	f.c.hitBytes.Add(desc.Size)
	return &chunkReadCloser{SectionReader: io.NewSectionReader(ch, 0, desc.Size), ch: ch}, true, nil
}

// Keep offers the cache b, the bytes of desc as the fetcher's source
// delivered them, not verified: a base a delta chunk was decoded from,
// which only the decoded chunk vouches for. The cache stores them without
// hashing them, as an entry not vouched for, which the first open of it
// (by any process) hashes, and drops if the bytes are not desc's. The
// bytes are only an offer: failures are ignored, and an entry already
// there is kept.
func (f *cachedFetcher) Keep(desc ocispec.Descriptor, b []byte) { f.c.keep(desc, b) }

// keep is Keep.
func (c *Cache) keep(desc ocispec.Descriptor, b []byte) {
	if !cacheable(desc) || int64(len(b)) != desc.Size || c.Contains(desc.Digest) {
		return
	}
	f, err := os.CreateTemp(c.tmpDir(), desc.Digest.Encoded()+"-*")
	if err != nil {
		return
	}
	defer os.Remove(f.Name())
	p := c.path(desc.Digest)
	if reserve(f, desc.Size) == nil {
		if _, err = f.Write(b); err == nil {
			c.deliver(f, p)
		}
	} else {
		err = errors.New("no room")
	}
	if cerr := f.Close(); err != nil || cerr != nil {
		return
	}
	// A link, not a rename: an entry stored meanwhile (verified) stays.
	if os.Link(f.Name(), p) != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Not verified, whatever an entry of the name gone since was: this
	// process hashes it too when it opens it.
	delete(c.verified, desc.Digest)
	if _, ok := c.entries[desc.Digest]; ok {
		return
	}
	el := c.lru.PushFront(&cacheEntry{d: desc.Digest, size: desc.Size})
	c.entries[desc.Digest] = el
	c.size += desc.Size
	c.evictLocked(el)
}
