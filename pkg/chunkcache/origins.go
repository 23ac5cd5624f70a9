package chunkcache

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

// The origin rule. A mount (or a pull, or warming) reads a version from
// one origin: a registry and repository, or a local layout. Digests are
// not secret, so a cached blob is served to a view of one origin only after
// that origin has delivered the blob's bytes once, verified: a version
// whose manifest names another tenant's chunk digests, served from a
// registry that does not hold them, reads none of them from the cache.
// Each entry records the origins that delivered it (an extended attribute
// beside the verification mark, and in this process's memory). A view
// that finds an entry its origin did not deliver fetches the blob from
// its origin; the verified bytes replace the entry with one that records
// the earlier origins and this one. So every reader of one repository
// shares the cache, and dedup across repositories costs one fetch per
// repository. A HEAD proves nothing (a forging registry answers it): only
// bytes that hash to the digest count.

// originsXattr lists, space separated, the originIDs that delivered an
// entry's bytes.
const originsXattr = "user.bdnvol.origins"

// maxOrigins bounds the origins one entry records (the attribute takes
// 25 bytes an origin; ext4 gives all of an inode's attributes one block).
// Past it the oldest is dropped, and costs its origin one fetch.
const maxOrigins = 64

// flightKey names one load in flight: a blob fetched from one origin is
// not handed to a caller of another.
type flightKey struct {
	d   digest.Digest
	oid string
}

// For returns a view of c for the origin origin ("host/repository" or
// "oci:/path", as oci.Ref.Repo gives): it serves an entry only once origin
// has delivered its bytes, fetches the others from the source it is given
// (which must read that origin) and records origin on what it fetches. The
// view shares c's entries, bound, statistics and loads. For("") is
// unscoped: every entry is served and no origin is recorded.
func (c *Cache) For(origin string) *Cache {
	if origin == "" {
		return &Cache{store: c.store}
	}
	return &Cache{store: c.store, origin: origin, oid: originID(origin)}
}

// Origin returns the origin of the view, "" for the unscoped cache.
func (c *Cache) Origin() string { return c.origin }

// originID is the name an origin is recorded under: 96 bits of its
// SHA-256, so that an attacker cannot choose a repository name that
// passes for another.
func originID(origin string) string {
	sum := sha256.Sum256([]byte(origin))
	return hex.EncodeToString(sum[:12])
}

// deliveredAt reports whether the entry at p (open as f, or nil) was
// delivered by c's origin; always true for the unscoped cache.
func (c *Cache) deliveredAt(p string, f *os.File) bool {
	if c.oid == "" {
		return true
	}
	c.mu.Lock()
	known := slices.Contains(c.delivered[p], c.oid)
	c.mu.Unlock()
	if known {
		return true
	}
	ids := readOrigins(p, f)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delivered[p] = mergeOrigins(c.delivered[p], ids)
	return slices.Contains(c.delivered[p], c.oid)
}

// deliver records on f, the verified new entry about to be renamed to p,
// the origins of the entry it replaces and c's own.
func (c *Cache) deliver(f *os.File, p string) {
	old := readOrigins(p, nil)
	c.mu.Lock()
	ids := mergeOrigins(c.delivered[p], old)
	if c.oid != "" {
		ids = mergeOrigins(ids, []string{c.oid})
	}
	if len(ids) > maxOrigins {
		ids = ids[len(ids)-maxOrigins:]
	}
	if len(ids) == 0 {
		delete(c.delivered, p)
	} else {
		c.delivered[p] = ids
	}
	c.mu.Unlock()
	if len(ids) > 0 {
		// Where attributes are unsupported the record lives in this
		// process only: after a restart each origin fetches once more.
		_ = unix.Fsetxattr(int(f.Fd()), originsXattr, []byte(strings.Join(ids, " ")), 0)
	}
}

// readOrigins returns the origins recorded on the entry at p (read
// through f when it is open). An entry without the attribute, or on a
// file system without attributes, has none.
func readOrigins(p string, f *os.File) []string {
	buf := make([]byte, maxOrigins*25+16)
	var n int
	var err error
	if f != nil {
		n, err = unix.Fgetxattr(int(f.Fd()), originsXattr, buf)
	} else {
		n, err = unix.Getxattr(p, originsXattr, buf)
	}
	if err != nil {
		return nil
	}
	var ids []string
	for _, id := range strings.Fields(string(buf[:n])) {
		if len(id) == 24 {
			ids = append(ids, id)
		}
	}
	return ids
}

// mergeOrigins returns a with those of b it lacks appended.
func mergeOrigins(a, b []string) []string {
	out := slices.Clip(a)
	for _, id := range b {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}
