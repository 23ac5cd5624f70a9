package chunkcache

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// Folded chunks. Once a backing file is made and verified, a chunk whose
// bytes lie whole in it is the same bytes twice on disk (ext4 cannot share
// them between two files). Fold keeps one copy: the chunk's entry is
// replaced by DIR/in/HEX (HEX: the chunk's SHA-256), a few bytes naming
// the backing file, where in it the chunk's bytes start, and how many
// there are, and carrying the origins (origins.go) that had delivered the
// chunk. A folded chunk is served from the backing file: Load, Contains
// and EntrySize find it as they find a chunk entry, and a view of an
// origin gets it only if that origin had delivered the chunk. The bytes
// are the chunk's because the backing file was written from the chunk's
// verified bytes and then verified whole against the file's digest; the
// backing file is trusted under its vouch mark (vouch.go) and hashed again
// without one, as OpenBacking does. Evicting or removing the backing file
// drops its folded chunks; a backing file with a folded chunk that an
// owner protects is evicted only in eviction's second pass, as the
// protected chunk itself would be.

// Piece is a chunk whose bytes lie whole in a file, from FileOffset.
type Piece struct {
	Chunk      ocispec.Descriptor
	FileOffset int64
}

func (c *Cache) foldDir() string { return filepath.Join(c.dir, "in") }

func (c *Cache) foldPath(d digest.Digest) string {
	return filepath.Join(c.foldDir(), d.Encoded())
}

// fold is what a folded chunk's entry says.
type fold struct {
	file digest.Digest
	off  int64
	size int64
}

// readFold reads the folded entry of chunk d.
func (c *Cache) readFold(d digest.Digest) (fold, bool) {
	b, err := os.ReadFile(c.foldPath(d))
	if err != nil || len(b) > 256 {
		return fold{}, false
	}
	fs := strings.Fields(string(b))
	if len(fs) != 3 {
		return fold{}, false
	}
	file := digest.NewDigestFromEncoded(digest.SHA256, fs[0])
	off, err1 := strconv.ParseInt(fs[1], 10, 64)
	size, err2 := strconv.ParseInt(fs[2], 10, 64)
	if !wellFormed(file) || err1 != nil || err2 != nil || off < 0 || size < 0 {
		return fold{}, false
	}
	return fold{file, off, size}, true
}

// Fold replaces the entries of pieces (chunks whose bytes lie whole in the
// backing file of file, at their FileOffset) by references into that
// backing file, which must be on disk: the chunks then take no disk of
// their own. It returns the bytes of chunk entries it removed. Call it
// only with pieces the backing file was assembled from.
func (c *Cache) Fold(file ocispec.Descriptor, pieces []Piece) (int64, error) {
	if !wellFormed(file.Digest) {
		return 0, fmt.Errorf("file %s: not a sha256 digest", file.Digest)
	}
	st, err := os.Stat(c.backingPath(file.Digest))
	if err != nil || st.Size() != file.Size {
		return 0, fmt.Errorf("file %s: no backing file to fold chunks into", file.Digest)
	}
	if err := os.MkdirAll(c.foldDir(), 0o755); err != nil {
		return 0, fmt.Errorf("chunk cache: %w", err)
	}
	var freed int64
	for _, p := range pieces {
		d := p.Chunk.Digest
		if !wellFormed(d) || p.FileOffset < 0 || p.FileOffset+p.Chunk.Size > file.Size {
			continue
		}
		cp := c.path(d)
		cst, err := os.Stat(cp)
		if err != nil || cst.Size() != p.Chunk.Size {
			continue
		}
		// The origins that delivered the chunk, and those of an earlier
		// fold of it (another origin's, whose chunk entry it replaced).
		fp := c.foldPath(d)
		c.mu.Lock()
		ids := mergeOrigins(mergeOrigins(nil, c.delivered[cp]), c.delivered[fp])
		c.mu.Unlock()
		ids = mergeOrigins(ids, readOrigins(cp, nil))
		ids = mergeOrigins(ids, readOrigins(fp, nil))
		if len(ids) > maxOrigins {
			ids = ids[len(ids)-maxOrigins:]
		}
		f, err := os.CreateTemp(c.tmpDir(), "in-"+d.Encoded()+"-*")
		if err != nil {
			return freed, fmt.Errorf("chunk cache: %w", err)
		}
		_, err = fmt.Fprintf(f, "%s %d %d\n", file.Digest.Encoded(), p.FileOffset, p.Chunk.Size)
		if err == nil && len(ids) > 0 {
			_ = unix.Fsetxattr(int(f.Fd()), originsXattr, []byte(strings.Join(ids, " ")), 0)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(f.Name(), c.foldPath(d))
		}
		if err != nil {
			os.Remove(f.Name())
			return freed, fmt.Errorf("chunk cache: %w", err)
		}
		c.mu.Lock()
		if len(ids) > 0 {
			c.delivered[fp] = ids
		}
		c.folds[file.Digest] = append(c.folds[file.Digest], d)
		c.mu.Unlock()
		if os.Remove(cp) == nil {
			freed += cst.Size()
		}
		c.forget(d)
	}
	return freed, nil
}

// openFolded returns the folded chunk desc, served from its backing file,
// or nil when there is none usable (for a view, none its origin
// delivered). A folded entry whose backing file is gone or damaged is
// removed.
func (c *Cache) openFolded(desc ocispec.Descriptor) Chunk {
	fd, ok := c.readFold(desc.Digest)
	if !ok {
		return nil
	}
	if fd.size != desc.Size {
		return nil
	}
	bp := c.backingPath(fd.file)
	f, err := os.Open(bp)
	if err != nil {
		c.dropFolded(desc.Digest)
		return nil
	}
	st, err := f.Stat()
	ok = err == nil && st.Mode().IsRegular() && fd.off+fd.size <= st.Size()
	if ok && !vouchedEntry(f, st) {
		h := sha256.New()
		_, err := io.Copy(h, io.NewSectionReader(f, 0, st.Size()))
		ok = err == nil && digest.NewDigest(digest.SHA256, h) == fd.file
		if ok {
			vouchEntry(bp)
		}
	}
	if !ok {
		f.Close()
		c.corrupt.Add(1)
		os.Remove(bp)
		c.forgetBacking(fd.file)
		c.dropFolded(desc.Digest)
		return nil
	}
	if !c.deliveredAt(c.foldPath(desc.Digest), nil) {
		f.Close()
		return nil
	}
	// No Chtimes here, as open does for a chunk: a backing file's mtime
	// is part of its vouch mark, and changing it would make the next
	// open hash the whole file again.
	c.mu.Lock()
	if el, ok := c.backings[fd.file]; ok {
		c.lru.MoveToFront(el)
	} else {
		c.backings[fd.file] = c.lru.PushFront(&cacheEntry{d: fd.file, size: st.Size(), backing: true})
		c.size += st.Size()
		c.evictLocked(c.backings[fd.file])
	}
	c.mu.Unlock()
	return &foldedChunk{SectionReader: io.NewSectionReader(f, fd.off, fd.size), f: f}
}

// foldedAt reports whether chunk d has a folded entry whose backing file
// is on disk, of size bytes, and that c's origin delivered.
func (c *Cache) foldedAt(d digest.Digest) (int64, bool) {
	fd, ok := c.readFold(d)
	if !ok {
		return 0, false
	}
	st, err := os.Stat(c.backingPath(fd.file))
	if err != nil || fd.off+fd.size > st.Size() {
		return 0, false
	}
	return fd.size, c.deliveredAt(c.foldPath(d), nil)
}

// dropFolded removes the folded entry of chunk d.
func (c *Cache) dropFolded(d digest.Digest) {
	fp := c.foldPath(d)
	os.Remove(fp)
	c.mu.Lock()
	delete(c.delivered, fp)
	c.mu.Unlock()
}

// dropFoldsLocked removes the folded entries into the backing file of
// file (evicted or removed).
func (c *Cache) dropFoldsLocked(file digest.Digest) {
	for _, d := range c.folds[file] {
		fp := c.foldPath(d)
		if fd, ok := c.readFold(d); ok && fd.file == file {
			os.Remove(fp)
		}
		delete(c.delivered, fp)
	}
	delete(c.folds, file)
}

// pinnedFoldsLocked reports whether an owner protects a chunk folded into
// the backing file of file.
func (c *Cache) pinnedFoldsLocked(file digest.Digest) bool {
	for _, d := range c.folds[file] {
		if c.pins[d] > 0 {
			return true
		}
	}
	return false
}

// indexFolds reads the folded entries on disk into c.folds.
func (c *Cache) indexFolds() {
	des, err := os.ReadDir(c.foldDir())
	if err != nil {
		return
	}
	for _, e := range des {
		d := digest.NewDigestFromEncoded(digest.SHA256, e.Name())
		if !wellFormed(d) {
			continue
		}
		if fd, ok := c.readFold(d); ok {
			c.folds[fd.file] = append(c.folds[fd.file], d)
		}
	}
}

// foldedChunk is a folded chunk: a section of its open backing file.
type foldedChunk struct {
	*io.SectionReader
	f *os.File
}

func (ch *foldedChunk) Close() error { return ch.f.Close() }
