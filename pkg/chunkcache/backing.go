package chunkcache

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// A backing file holds the bytes of one whole file of a volume,
// contiguously, in DIR/files/HEX (HEX: the file's SHA-256), so that a FUSE
// mount can let the kernel read it directly (passthrough). It is made from
// verified chunks, hashed against the file's digest as it is written, and
// counted in the cache's bound and LRU like a chunk; it is never evicted
// while open.

// ErrNoRoom is returned by Assemble when the backing file would not fit in
// the cache's bound without evicting protected entries or open backing
// files.
var ErrNoRoom = errors.New("no room in the chunk cache for a backing file")

// ErrBusy is returned by Assemble when this process is already assembling
// the same backing file.
var ErrBusy = errors.New("backing file already being assembled")

// Backing is an open, verified backing file. Close releases it; until then
// the cache does not evict it.
type Backing struct {
	c    *Cache
	d    digest.Digest
	f    *os.File
	once sync.Once
}

// File returns the open backing file (read-only).
func (b *Backing) File() *os.File { return b.f }

// Close closes the file and lets the cache evict it again; if the cache is
// over its bound, eviction runs now.
func (b *Backing) Close() error {
	var err error
	b.once.Do(func() {
		err = b.f.Close()
		c := b.c
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.backingOpen[b.d]--; c.backingOpen[b.d] <= 0 {
			delete(c.backingOpen, b.d)
		}
		c.evictLocked(nil)
	})
	return err
}

func (c *Cache) backingDir() string { return filepath.Join(c.dir, "files") }

func (c *Cache) backingPath(d digest.Digest) string {
	return filepath.Join(c.backingDir(), d.Encoded())
}

// OpenBacking returns the backing file of the file desc (its SHA-256 and
// size), or nil when the cache holds none that is usable. An entry is used
// only when its size matches and it carries a valid verification mark or
// hashes to desc.Digest; a wrong one is removed.
func (c *Cache) OpenBacking(desc ocispec.Descriptor) (*Backing, error) {
	if !wellFormed(desc.Digest) || desc.Size < 0 {
		return nil, fmt.Errorf("file %s: not a sha256 digest", desc.Digest)
	}
	p := c.backingPath(desc.Digest)
	f, err := os.Open(p)
	if err != nil {
		c.forgetBacking(desc.Digest)
		return nil, nil
	}
	st, err := f.Stat()
	ok := err == nil && st.Mode().IsRegular() && st.Size() == desc.Size
	if ok && !vouchedEntry(f, st) {
		h := sha256.New()
		n, err := io.Copy(h, io.NewSectionReader(f, 0, desc.Size))
		ok = err == nil && verify.Digest("file", desc, digest.NewDigest(digest.SHA256, h), n) == nil
		if ok {
			vouchEntry(p)
		}
	}
	if !ok {
		f.Close()
		c.corrupt.Add(1)
		os.Remove(p)
		c.forgetBacking(desc.Digest)
		return nil, nil
	}
	if !c.deliveredAt(p, f) {
		f.Close() // kept: Assemble for this origin replaces it
		return nil, nil
	}
	return c.openedBacking(desc, f), nil
}

// openedBacking accounts for the open backing file f of desc.
func (c *Cache) openedBacking(desc ocispec.Descriptor, f *os.File) *Backing {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backingOpen[desc.Digest]++
	el, ok := c.backings[desc.Digest]
	if ok {
		c.lru.MoveToFront(el)
	} else {
		el = c.lru.PushFront(&cacheEntry{d: desc.Digest, size: desc.Size, backing: true})
		c.backings[desc.Digest] = el
		c.size += desc.Size
	}
	c.evictLocked(el)
	c.backingsOpened.Add(1)
	return &Backing{c: c, d: desc.Digest, f: f}
}

// forgetBacking removes the backing file of d from the accounting.
func (c *Cache) forgetBacking(d digest.Digest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.backings[d]; ok {
		c.size -= el.Value.(*cacheEntry).size
		c.lru.Remove(el)
		delete(c.backings, d)
	}
	delete(c.delivered, c.backingPath(d))
	c.dropFoldsLocked(d)
}

// Assemble makes the backing file of the file desc and returns it open:
// write writes the file's bytes in order (from verified chunks), and they
// are hashed as they are written; the file gets its name only if they are
// desc.Size bytes hashing to desc.Digest. It fails with ErrNoRoom when the
// file does not fit beside the protected entries and open backing files,
// and with ErrBusy while another Assemble of desc runs in this process.
func (c *Cache) Assemble(ctx context.Context, desc ocispec.Descriptor, write func(w io.Writer) error) (*Backing, error) {
	if !wellFormed(desc.Digest) || desc.Size < 0 {
		return nil, fmt.Errorf("file %s: not a sha256 digest", desc.Digest)
	}
	c.mu.Lock()
	if c.building[desc.Digest] {
		c.mu.Unlock()
		return nil, ErrBusy
	}
	if c.keptBytesLocked()+desc.Size > c.max {
		c.mu.Unlock()
		return nil, fmt.Errorf("file %s of %d bytes: %w", desc.Digest, desc.Size, ErrNoRoom)
	}
	c.building[desc.Digest] = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.building, desc.Digest)
		c.mu.Unlock()
	}()
	if b, err := c.OpenBacking(desc); b != nil || err != nil {
		return b, err // another process made it
	}
	if err := os.MkdirAll(c.backingDir(), 0o755); err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	f, err := os.CreateTemp(c.tmpDir(), "file-"+desc.Digest.Encoded()+"-*")
	if err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := reserve(f, desc.Size); err != nil {
		return nil, fmt.Errorf("file %s: %w", desc.Digest, err)
	}
	hw := &hashWriter{w: f, h: sha256.New()}
	if err := write(hw); err != nil {
		return nil, fmt.Errorf("file %s: %w", desc.Digest, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := verify.Digest("file", desc, digest.NewDigest(digest.SHA256, hw.h), hw.n); err != nil {
		c.corrupt.Add(1)
		return nil, err
	}
	c.deliver(f, c.backingPath(desc.Digest))
	if err := os.Rename(f.Name(), c.backingPath(desc.Digest)); err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	vouchEntry(c.backingPath(desc.Digest))
	f.Close()
	keep = true
	r, err := os.Open(c.backingPath(desc.Digest))
	if err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	c.backingsMade.Add(1)
	return c.openedBacking(desc, r), nil
}

// keptBytesLocked returns the bytes eviction may not take: protected
// chunks and open backing files.
func (c *Cache) keptBytesLocked() int64 {
	var n int64
	for el := c.lru.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*cacheEntry); !c.evictable(e, false) {
			n += e.size
		}
	}
	return n
}

// evictable reports whether eviction may take e: an open backing file
// never; a protected chunk only in the second pass (protectedToo).
func (c *Cache) evictable(e *cacheEntry, protectedToo bool) bool {
	if e.backing {
		return c.backingOpen[e.d] == 0 && (protectedToo || !c.pinnedFoldsLocked(e.d))
	}
	return protectedToo || c.pins[e.d] == 0
}

// indexBackings adds the backing files on disk to the entries found, for
// Open to account.
func (c *Cache) indexBackings() []found {
	des, err := os.ReadDir(c.backingDir())
	if err != nil {
		return nil
	}
	var fs []found
	for _, e := range des {
		d := digest.NewDigestFromEncoded(digest.SHA256, e.Name())
		info, err := e.Info()
		if err != nil || d.Validate() != nil || !info.Mode().IsRegular() {
			continue
		}
		fs = append(fs, found{d: d, size: info.Size(), mtime: info.ModTime(), backing: true})
	}
	return fs
}

// hashWriter writes to w and hashes what it writes.
type hashWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (w *hashWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	return n, err
}
