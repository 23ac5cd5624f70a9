package pull

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
	"github.com/bdnvol/bdnvol/pkg/peer"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// Options configure Pull and Materialise (which uses only Jobs,
// VerifyFiles, Counters, StatCache and Select). Zero values select
// defaults.
type Options struct {
	OCI     oci.Options
	Mirrors oci.MirrorConfig
	Policy  signature.Policy // checked right after the reference is resolved
	// CacheDir holds the chunk cache (CacheDir/chunks) and the stat cache of
	// the directories pulled into.
	CacheDir string
	// Cache is how the chunk cache is used: by default chunks already there
	// are used and none is added (the directory holds every byte anyway).
	Cache     CacheMode
	CacheSize int64 // the chunk cache's bound with CacheFill
	Jobs      int   // concurrent chunk fetches; <= 0 means 8
	// VerifyFiles checks every written file's SHA-256 before it is renamed
	// into place.
	VerifyFiles bool
	Counters    *progress.Counters // progress; nil for none
	// Select, when set, makes a partial pull: only the regular files and
	// symlinks whose path it accepts are written, with the directories
	// that hold them (see layout.Index.Selection), and only their chunks
	// are fetched (a pack whole, for the files in it that are selected).
	// Nothing else in the directory is written, and nothing outside the
	// selection is removed, even a file an earlier pull wrote that the
	// version lacks.
	Select func(path string) bool
	// StatCache remembers what the files written hold, so that a later
	// pull into the directory (an upgrade) keeps or copies them. Pull opens
	// the one of the directory under CacheDir when it is nil; Materialise
	// then keeps no record.
	StatCache *statcache.Cache
	// Progress (if set) is started once the version is open; the function
	// it returns is called when the pull ends.
	Progress func() func()
	// Logf (if set) is told what the caller may want to show.
	Logf func(format string, args ...any)
	// Peers, when set, makes the pull a node of a peer tier for its
	// duration (pkg/peer): it serves the chunks of its cache to the other
	// nodes, fetches from the registry the chunks it owns (once), asks
	// their owners for the others, and once done serves what it holds
	// until no peer asked for PeerLinger. The chunk cache is filled
	// (CacheFill; CacheOff is refused).
	Peers *peer.Config
	// PeerLinger is how long a pull with Peers goes on serving after it
	// finished once no peer asks (<= 0: 5 s); it serves 10 minutes at most.
	PeerLinger time.Duration
}

// CacheMode is how a pull uses the node's chunk cache.
type CacheMode int

// Cache modes.
const (
	CacheRead CacheMode = iota // use chunks already cached, add none
	CacheFill                  // also add the chunks fetched
	CacheOff                   // neither use nor fill the cache
)

// CacheModeOf is the mode `--cache` (fill) or `--no-cache` (off) asks
// for; fill wins; CacheRead without either.
func CacheModeOf(fill, off bool) CacheMode {
	switch {
	case fill:
		return CacheFill
	case off:
		return CacheOff
	}
	return CacheRead
}

// Result is what a pull did; Materialise fills all but Digest, Reference,
// CacheHits, MirrorHits and Seconds.
type Result struct {
	Digest        string `json:"digest"`
	Reference     string `json:"reference"`
	Files         int    `json:"files"`
	Bytes         int64  `json:"bytes"`
	ChunksFetched int64  `json:"chunks_fetched"`
	BytesFetched  int64  `json:"bytes_fetched"`
	FilesReused   int    `json:"files_reused"`
	// FilesUnlooked are reused files of index pieces the last whole pull
	// into DIR wrote as they are: kept on that pull's records, unopened.
	FilesUnlooked int   `json:"files_unlooked"`
	ChunksCopied  int64 `json:"chunks_copied"`
	BytesCopied   int64 `json:"bytes_copied"`
	// ChunksCopiedUnhashed are copies an earlier pull's record vouched for.
	ChunksCopiedUnhashed int64 `json:"chunks_copied_unhashed"`
	// FilesHashed are files found in place with no record of them, read
	// whole to compare with their digests.
	FilesHashed int `json:"files_hashed"`
	// LocalMisses are chunks looked for in files already in DIR that were
	// not there after all, and were fetched.
	LocalMisses  int64 `json:"local_misses"`
	FilesRemoved int   `json:"files_removed"`
	CacheHits    int64 `json:"cache_hits"`
	MirrorHits   int64 `json:"mirror_hits"`
	// PeerBytes are the chunk bytes peers sent (with Options.Peers),
	// ServedToPeers the bytes this pull sent them.
	PeerBytes     int64   `json:"peer_bytes,omitempty"`
	ServedToPeers int64   `json:"served_to_peers,omitempty"`
	Seconds       float64 `json:"seconds"`
}

// Pull resolves ref (a tag becomes a digest now), checks opt.Policy, and
// writes the version's tree into dir (created if missing).
func Pull(ctx context.Context, ref oci.Ref, dir string, opt Options) (*Result, error) {
	start := time.Now()
	if ref.Layout != "" && len(opt.Mirrors.URLs) > 0 && opt.Logf != nil {
		opt.Logf("%s is a local layout; mirrors are not used", ref.Repo())
	}
	if opt.Peers != nil && ref.Layout == "" {
		if opt.Cache == CacheOff {
			return nil, fmt.Errorf("the peer tier serves the chunk cache: it cannot be used without it")
		}
		opt.Cache = CacheFill
	}
	var whole *chunkcache.Cache
	if opt.Cache != CacheOff {
		// Without CacheFill nothing is added, so open with no bound: a
		// smaller one than the mounts' would evict their chunks.
		max := int64(math.MaxInt64)
		if opt.Cache == CacheFill {
			max = opt.CacheSize
		}
		var err error
		if whole, err = chunkcache.Open(filepath.Join(opt.CacheDir, "chunks"), max); err != nil {
			return nil, err
		}
	}
	var node *peer.Node
	var scoped *peer.Fetcher
	ropt := origin.Options{OCI: opt.OCI, Mirrors: opt.Mirrors, Policy: opt.Policy}
	if opt.Peers != nil && ref.Layout == "" {
		var err error
		if node, err = peer.Start(*opt.Peers, whole); err != nil {
			return nil, err
		}
		defer node.Close()
		ropt.Peers = func(ref oci.Ref, src content.Fetcher) content.Fetcher {
			scoped = node.Fetcher(ref.Registry, ref.Repository, src)
			return scoped
		}
	}
	o, err := origin.Resolve(ctx, ref, ropt)
	if err != nil {
		return nil, err
	}
	if scoped != nil {
		defer scoped.Close()
	}
	desc, src, mirrors := o.Root, o.Fetcher, o.Mirrors
	wrap := func(f content.Fetcher) content.Fetcher { return f }
	var cache *chunkcache.Cache
	if whole != nil {
		cache = whole.For(o.Name()) // what this repository delivered (chunkcache's origin rule)
		wrap = cache.ReadOnly
		if opt.Cache == CacheFill {
			wrap = cache.Fetcher
		}
	}
	v, err := origin.Open(ctx, wrap(src), desc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	if scoped != nil {
		scoped.Opened(v) // this node fetches the chunks it owns for its peers
	}
	src = wrap(v.ChunkSourceBases(src, wrap(src))) // the registry's blobs, or a foreign artifact's chunks
	stop := func() {}
	if opt.Progress != nil {
		stop = opt.Progress()
	}
	if opt.StatCache == nil {
		opt.StatCache = statcache.Open(opt.CacheDir, dir, layout.Params{})
	}
	out, err := Materialise(ctx, src, v, dir, opt)
	stop()
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref.Pinned(desc.Digest), err)
	}
	out.Digest, out.Reference = desc.Digest.String(), ref.Pinned(desc.Digest)
	out.Seconds = time.Since(start).Seconds()
	if cache != nil {
		out.CacheHits = cache.Stats().Hits
	}
	if mirrors != nil {
		out.MirrorHits = mirrors.Stats().Hits
	}
	if node != nil {
		if scoped != nil {
			scoped.Close() // the registry no longer: what this node holds only
		}
		linger := opt.PeerLinger
		if linger <= 0 {
			linger = 5 * time.Second
		}
		node.Linger(ctx, linger, 10*time.Minute)
		out.PeerBytes, out.ServedToPeers = node.Stats.PeerBytes.Load(), node.Server.Stats().ServedBytes
	}
	return out, nil
}
