package chunkcache

import (
	"os"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Protect records that owner (a running mount, a warm list entry) needs the
// blobs descs, replacing what owner protected before. Eviction takes a
// protected entry only when the protected entries alone exceed the bound.
// Protection lives in this process's memory only.
func (c *Cache) Protect(owner string, descs []ocispec.Descriptor) {
	set := make(map[digest.Digest]int64, len(descs))
	for _, d := range descs {
		set[d.Digest] = d.Size
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unprotectLocked(owner)
	c.owners[owner] = set
	for d := range set {
		c.pins[d]++
	}
}

// Unprotect drops owner's protection.
func (c *Cache) Unprotect(owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unprotectLocked(owner)
}

func (c *Cache) unprotectLocked(owner string) {
	for d := range c.owners[owner] {
		if c.pins[d]--; c.pins[d] <= 0 {
			delete(c.pins, d)
		}
	}
	delete(c.owners, owner)
}

// Protected returns the union of the blobs protected by the owners for which
// keep returns true, with their sizes.
func (c *Cache) Protected(keep func(owner string) bool) map[digest.Digest]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[digest.Digest]int64{}
	for o, set := range c.owners {
		if !keep(o) {
			continue
		}
		for d, n := range set {
			out[d] = n
		}
	}
	return out
}

// Max returns the cache's bound in bytes.
func (c *Cache) Max() int64 { return c.max }

// Remove deletes the entry of d unless an owner in this process protects
// it; it reports whether an entry was removed. A digest that is not a
// well-formed sha256 digest names no entry.
func (c *Cache) Remove(d digest.Digest) bool {
	if !wellFormed(d) {
		return false
	}
	c.mu.Lock()
	pinned := c.pins[d] > 0
	c.mu.Unlock()
	if pinned {
		return false
	}
	err := os.Remove(c.path(d))
	c.forget(d)
	fd, folded := c.readFold(d)
	if folded {
		c.dropFolded(d)
		c.removeBacking(fd.file)
	}
	return err == nil || folded
}

// removeBacking removes the backing file of file, which held a chunk just
// removed, with the chunks folded into it, unless it is open, being made,
// or holds a folded chunk an owner protects: it is the removed chunk's
// disk, which would otherwise stay until evicted.
func (c *Cache) removeBacking(file digest.Digest) {
	c.mu.Lock()
	busy := c.backingOpen[file] > 0 || c.building[file] || c.pinnedFoldsLocked(file)
	c.mu.Unlock()
	if busy {
		return
	}
	os.Remove(c.backingPath(file))
	c.forgetBacking(file)
}

// EntrySize returns the size of d's entry on disk, and whether there is one.
func (c *Cache) EntrySize(d digest.Digest) (int64, bool) {
	if !wellFormed(d) {
		return 0, false
	}
	st, err := os.Stat(c.path(d))
	if err != nil || !st.Mode().IsRegular() {
		if fd, ok := c.readFold(d); ok {
			if bst, err := os.Stat(c.backingPath(fd.file)); err == nil && fd.off+fd.size <= bst.Size() {
				return fd.size, true
			}
		}
		return 0, false
	}
	return st.Size(), true
}
