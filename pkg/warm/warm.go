package warm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/ratelimit"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
	"github.com/bdnvol/bdnvol/pkg/profile"
)

// ErrDoesNotFit means the versions asked for, with what running mounts
// need, are larger than the cache's bound.
var ErrDoesNotFit = errors.New("does not fit in the chunk cache")

// ErrIncomplete means a warm ended with chunks missing.
var ErrIncomplete = errors.New("not completely cached")

// Options say how versions are reached.
type Options struct {
	OCI     oci.Options
	Mirrors oci.MirrorConfig
	// Wrap, when set, wraps the fetcher of a registry (as mounts.OpenOptions.Wrap).
	Wrap func(source, host string, f content.Fetcher) content.Fetcher
	// Peers, when set, puts the cluster's peers in front of the registry
	// (origin.Options.Peers): N nodes warming one version fetch each chunk
	// from the registry about once. Close the Opened when done with it.
	Peers func(ref oci.Ref, src content.Fetcher) content.Fetcher
	// Profile finds each version's startup profile, whose chunks are
	// warmed first, in its order; the zero value uses none.
	Profile profile.Options
}

// Opened is one version opened for warming: its index read (through the
// cache) and the blobs the asked-for files need.
type Opened struct {
	Ref     string // as given
	Pinned  string
	Version *layout.Version
	Need    []ocispec.Descriptor // unique chunks, in file order
	// Patterns are the globs asked for ("" for every file).
	Patterns string
	src      content.Fetcher
	origin   string // what Fill records as the chunks' origin (chunkcache.For)
	scoped   origin.Scoped
	files    []int // the asked-for regular files, by index
}

// Close ends what the warm's source serves (the peer tier's fetch for its
// peers of the chunks this node owns).
func (t *Opened) Close() {
	if t.scoped != nil {
		t.scoped.Close()
	}
}

// Open resolves ref (a tag becomes a digest now), reads its index through
// cache and lists the chunks of the files patterns matches (every file when
// patterns is "" or "all").
//
// No signature policy is checked: a warm only puts blobs in the cache, each
// verified against its digest, and nothing in the cache is used but through
// a mount, which checks its own policy when it resolves the reference
// (bdnvol mount in origin.Resolve, the node plugin at publish) before any of
// the version is read.
func Open(ctx context.Context, cache *chunkcache.Cache, ref, patterns string, opt Options) (*Opened, error) {
	r, err := oci.ParseRef(ref)
	if err != nil {
		return nil, err
	}
	o, err := origin.Resolve(ctx, r, origin.Options{OCI: opt.OCI, Mirrors: opt.Mirrors, Wrap: opt.Wrap, Peers: opt.Peers})
	if err != nil {
		return nil, err
	}
	desc, src := o.Root, o.Fetcher
	scoped, _ := src.(origin.Scoped)
	cache = cache.For(o.Name()) // chunkcache's origin rule: what ref's repository delivered
	ver, err := origin.Open(ctx, cache.Fetcher(src), desc)
	if err != nil {
		if scoped != nil {
			scoped.Close()
		}
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	if scoped != nil {
		scoped.Opened(ver)
	}
	if patterns == "all" {
		patterns = ""
	}
	var match func(string) bool
	if patterns != "" {
		if match, err = lazy.MatchGlobs(patterns); err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
	}
	tg := &Opened{Ref: ref, Pinned: r.Pinned(desc.Digest), Version: ver, Patterns: patterns, src: ver.ChunkSource(src), origin: o.Name(), scoped: scoped}
	seen := map[int]bool{}
	for fi := range ver.Index.Len() {
		f := ver.Index.File(fi)
		if f.Type != layout.TypeFile || (match != nil && !match(f.Path)) {
			continue
		}
		tg.files = append(tg.files, fi)
		for _, x := range f.Extents {
			if !seen[x.Chunk] {
				seen[x.Chunk] = true
				tg.Need = append(tg.Need, ver.Chunk(x.Chunk))
			}
		}
	}
	tg.profileFirst(ctx, o.Target, opt.Profile)
	return tg, nil
}

// Digest returns the version's digest.
func (t *Opened) Digest() digest.Digest { return t.Version.Root.Digest }

// Record returns the record of t.
func (t *Opened) Record() Record {
	r := Record{Ref: t.Ref, Pinned: t.Pinned, Root: t.Version.Root, Patterns: t.Patterns}
	for _, d := range t.Need {
		r.Chunks = append(r.Chunks, Blob{Digest: d.Digest, Size: d.Size})
	}
	return r
}

// Bytes returns the size of the blobs t needs.
func (t *Opened) Bytes() int64 {
	var n int64
	for _, d := range t.Need {
		n += d.Size
	}
	return n
}

// FillOptions configure Fill.
type FillOptions struct {
	Jobs    int                // concurrent fetches; <= 0 means 4
	Limiter *ratelimit.Limiter // paces fetched bytes; nil for no bound
	// Progress is told the bytes of each blob that became cached (fetched
	// or found); it may be called concurrently.
	Progress func(n int64)
}

// Fill loads every blob t needs into cache, fetching and verifying what is
// missing, and stops at the first failure (a registry that fails one chunk
// mostly fails the next). Blobs already cached are checked, not fetched, so
// a stopped fill resumes where it was. Then it makes the backing file of
// each file a mount serves by passthrough (lazy.BuildBacking), so that the
// first open of a warm file after a mount is served from disk at once
// rather than waiting while the file's chunks are copied into one.
func (t *Opened) Fill(ctx context.Context, cache *chunkcache.Cache, opt FillOptions) error {
	if opt.Jobs <= 0 {
		opt.Jobs = 4
	}
	cache = cache.For(t.origin)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opt.Jobs)
	for _, d := range t.Need {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			if !cache.Contains(d.Digest) {
				if err := opt.Limiter.Wait(gctx, d.Size); err != nil {
					return err
				}
			}
			ch, err := cache.Load(gctx, t.src, d)
			if err != nil {
				return fmt.Errorf("%s: %w", t.Pinned, err)
			}
			ch.Close()
			if opt.Progress != nil {
				opt.Progress(d.Size)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := t.buildBackings(ctx, cache); err != nil {
		return err
	}
	return ctx.Err()
}

// backingJobs is how many backing files Fill makes at once: each reads,
// hashes and writes a whole file, so two keep the disk busy without taking
// every core.
const backingJobs = 2

// buildBackings makes the backing files of t's files from cache (t's
// origin's view). A file that gets none (too small, no room) is left to
// the mount, which serves it through FUSE; bytes that do not verify fail.
func (t *Opened) buildBackings(ctx context.Context, cache *chunkcache.Cache) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(backingJobs)
	for _, fi := range t.files {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			if _, err := lazy.BuildBacking(gctx, cache, t.Version, fi); err != nil {
				return fmt.Errorf("%s: %s: %w", t.Pinned, t.Version.Index.File(fi).Path, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// Cached returns the bytes of descs the cache holds (for a view, that its
// origin delivered) and the number of blobs missing.
func Cached(cache *chunkcache.Cache, descs []ocispec.Descriptor) (bytes int64, missing int) {
	for _, d := range descs {
		if n, ok := cache.EntrySize(d.Digest); ok && n == d.Size && cache.Contains(d.Digest) {
			bytes += d.Size
		} else {
			missing++
		}
	}
	return bytes, missing
}

// union adds descs to set and returns the bytes it added.
func union(set map[digest.Digest]int64, descs []ocispec.Descriptor) int64 {
	var n int64
	for _, d := range descs {
		if _, ok := set[d.Digest]; !ok {
			set[d.Digest] = d.Size
			n += d.Size
		}
	}
	return n
}

func total(set map[digest.Digest]int64) int64 {
	var n int64
	for _, s := range set {
		n += s
	}
	return n
}

// InUseBlobs returns the blobs of the recorded versions a mount holds now
// (in any process), with their sizes, and those versions' pinned refs.
func InUseBlobs(s Store) (map[digest.Digest]int64, []string) {
	set := map[digest.Digest]int64{}
	var used []string
	recs, _ := s.List()
	for _, r := range recs {
		if s.InUse(r.Root.Digest) {
			union(set, r.Descriptors())
			used = append(used, r.Pinned)
		}
	}
	return set, used
}

// WarmOptions configure Warm.
type WarmOptions struct {
	Options
	Patterns string // --prefetch-style globs; "" or "all" for whole versions
	Fill     FillOptions
	// OnOpened is told about each version once it is resolved.
	OnOpened func(t *Opened)
}

// Warm fills cache with the versions refs name, all of them or none: it
// fails with ErrDoesNotFit, before fetching anything, when they and the
// versions mounted now do not fit together in the cache's bound. While it
// runs, this process evicts neither their blobs nor those of mounted
// versions. It returns nil only when every blob is cached and verified.
func Warm(ctx context.Context, cache *chunkcache.Cache, refs []string, opt WarmOptions) ([]*Opened, error) {
	store := StoreOf(cache)
	used, _ := InUseBlobs(store)
	need := map[digest.Digest]int64{}
	for d, n := range used {
		need[d] = n
	}
	var targets []*Opened
	for _, ref := range refs {
		t, err := Open(ctx, cache, ref, opt.Patterns, opt.Options)
		if err != nil {
			return targets, err
		}
		targets = append(targets, t)
		union(need, t.Need)
		if opt.OnOpened != nil {
			opt.OnOpened(t)
		}
	}
	if n := total(need); n > cache.Max() {
		return targets, fmt.Errorf("%d bytes (with %d bytes of mounted versions) for a cache of %d bytes: %w",
			n, total(used), cache.Max(), ErrDoesNotFit)
	}
	owner := fmt.Sprintf("warm-cli:%p", &need)
	all := make([]ocispec.Descriptor, 0, len(need))
	for d, n := range need {
		all = append(all, ocispec.Descriptor{Digest: d, Size: n})
	}
	cache.Protect(owner, all)
	defer cache.Unprotect(owner)
	for _, t := range targets {
		if err := t.Fill(ctx, cache, opt.Fill); err != nil {
			return targets, err
		}
		if _, missing := Cached(cache, t.Need); missing > 0 {
			return targets, fmt.Errorf("%s: %d chunks missing: %w", t.Pinned, missing, ErrIncomplete)
		}
		rec := t.Record()
		rec.Warmed = time.Now().UTC()
		if old, err := store.Get(t.Digest()); err == nil {
			rec.Used = old.Used
		}
		if err := store.Put(rec); err != nil {
			return targets, err
		}
	}
	return targets, nil
}

// Entry is what `bdnvol cache ls` shows of one recorded version.
type Entry struct {
	Record
	Cached   int64 `json:"cached"` // bytes of its blobs in the cache
	Total    int64 `json:"total"`
	Complete bool  `json:"complete"`
	InUse    bool  `json:"in_use"` // a mount holds it now
}

// MarshalJSON writes e as `bdnvol cache ls --json` prints it: the record's
// references and globs with what the cache holds, without its chunk list.
func (e Entry) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Ref      string `json:"ref"`
		Pinned   string `json:"pinned"`
		Patterns string `json:"patterns,omitempty"`
		Cached   int64  `json:"cached"`
		Total    int64  `json:"total"`
		Complete bool   `json:"complete"`
		InUse    bool   `json:"in_use"`
	}{e.Ref, e.Pinned, e.Patterns, e.Cached, e.Total, e.Complete, e.InUse})
}

// List returns what the cache holds of each recorded version.
func List(cache *chunkcache.Cache) ([]Entry, error) {
	store := StoreOf(cache)
	recs, err := store.List()
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(recs))
	for _, r := range recs {
		cached, missing := Cached(cache, r.Descriptors())
		out = append(out, Entry{Record: r, Cached: cached, Total: r.Bytes(), Complete: missing == 0, InUse: store.InUse(r.Root.Digest)})
	}
	return out, nil
}

// Removed is what Remove and GC dropped.
type Removed struct {
	Versions []string // pinned references whose records went
	Blobs    int
	Bytes    int64
	// Skipped holds why each malformed record (ErrBadRecord) was left
	// alone: neither it nor anything it names was removed.
	Skipped []error
}

// Remove drops the records of the versions matching ref (a pinned
// reference, a tag as recorded, or a digest) and their blobs that no
// version in use and no other recorded version needs. A version a mount
// holds is refused, naming it.
func Remove(cache *chunkcache.Cache, ref string) (Removed, error) {
	match := func(_ Store, r Record) bool { return r.Ref == ref || r.Pinned == ref || r.Root.Digest.String() == ref }
	return removeWhere(cache, match, func(store Store, drop []Record) error {
		if len(drop) == 0 {
			return fmt.Errorf("%s: %w", ref, ErrNoRecord)
		}
		for _, r := range drop {
			if store.InUse(r.Root.Digest) {
				return fmt.Errorf("%s: %w", r.Pinned, ErrInUse)
			}
		}
		return nil
	})
}

// ErrInUse means a mount holds the version.
var ErrInUse = errors.New("a running mount uses this version")

// GC drops every recorded version no mount holds, and its blobs that
// versions in use do not need.
func GC(cache *chunkcache.Cache) (Removed, error) {
	unused := func(store Store, r Record) bool { return !store.InUse(r.Root.Digest) }
	return removeWhere(cache, unused, nil)
}

// removeWhere drops the recorded versions pick chooses, with their blobs
// that no other version needs (removeRecords); refuse, when set, may
// refuse the choice before anything is removed.
func removeWhere(cache *chunkcache.Cache, pick func(Store, Record) bool, refuse func(Store, []Record) error) (Removed, error) {
	store := StoreOf(cache)
	recs, skipped, err := store.Records()
	if err != nil {
		return Removed{}, err
	}
	var drop []Record
	for _, r := range recs {
		if pick(store, r) {
			drop = append(drop, r)
		}
	}
	if refuse != nil {
		if err := refuse(store, drop); err != nil {
			return Removed{Skipped: skipped}, err
		}
	}
	out, err := removeRecords(cache, store, recs, drop)
	out.Skipped = skipped
	return out, err
}

func removeRecords(cache *chunkcache.Cache, store Store, all, drop []Record) (Removed, error) {
	dropped := map[digest.Digest]bool{}
	for _, r := range drop {
		dropped[r.Root.Digest] = true
	}
	keep := map[digest.Digest]int64{}
	for _, r := range all {
		if !dropped[r.Root.Digest] {
			union(keep, r.Descriptors())
		}
	}
	var out Removed
	for _, r := range drop {
		for _, b := range r.Chunks {
			if _, ok := keep[b.Digest]; ok {
				continue
			}
			keep[b.Digest] = b.Size // once
			if cache.Remove(b.Digest) {
				out.Blobs++
				out.Bytes += b.Size
			}
		}
		cache.Remove(r.Root.Digest)
		if err := store.Delete(r.Root.Digest); err != nil {
			return out, err
		}
		out.Versions = append(out.Versions, r.Pinned)
	}
	sort.Strings(out.Versions)
	return out, nil
}
