package warm

import (
	"errors"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/mounts"
)

// HoldServed returns the Hold of mounts.RunOptions for mounts over cache:
// each version served is held (see Hold) under its pinned reference; an
// error writing its record or lease is told to logf, and the mount goes on.
func HoldServed(cache *chunkcache.Cache, logf func(format string, args ...any)) func(*mounts.Served) func() {
	return func(s *mounts.Served) func() {
		release, err := Hold(cache, s.Volume.Version(), s.Pinned, s.Pinned, s.Mountpoint)
		if err != nil {
			logf("%s", termsafe.Text(err.Error()))
		}
		return release
	}
}

// Hold records that the version ver is mounted at mountpoint: it protects
// every chunk of the version in cache (in this process: warming evicts none
// of them), writes its record next to the cache (last used now) and a lease
// on the mountpoint (so `bdnvol cache ls`, `rm` and `gc` in any process see
// it in use). release drops all three. An error writing the record or the
// lease is returned with a working release; the mount can go on.
func Hold(cache *chunkcache.Cache, ver *layout.Version, ref, pinned, mountpoint string) (release func(), err error) {
	store := StoreOf(cache)
	rec, gerr := store.Get(ver.Root.Digest)
	if gerr != nil || rec.Patterns != "" {
		rec = Record{Ref: ref, Pinned: pinned, Root: ver.Root, Warmed: rec.Warmed}
		for k := range ver.NumChunks() {
			rec.Chunks = append(rec.Chunks, Blob{Digest: ver.Index.ChunkDigest(k), Size: ver.Index.ChunkSize(k)})
		}
	}
	rec.Used = time.Now().UTC()
	perr := store.Put(rec)
	owner := "mount:" + mountpoint
	cache.Protect(owner, ver.ChunkDescriptors())
	drop, lerr := store.Lease(ver.Root.Digest, mountpoint)
	if lerr != nil {
		drop = func() {}
	}
	return func() { drop(); cache.Unprotect(owner) }, errors.Join(perr, lerr)
}
