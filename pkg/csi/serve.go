package csi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/metrics"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// MounterProcess configures ServeMounter: the mounter process of a node
// (its socket, directories, cache, warm list, metrics and peer tier), where
// MounterOptions configure the Mounter that process serves.
type MounterProcess struct {
	Socket    string // the unix socket the node plugin calls
	Version   string // the binary's version, logged
	MountsDir string // where the per-digest FUSE mounts live
	StateDir  string // where the node plugin records what it published
	CacheDir  string // the node's chunk cache is CacheDir/chunks ("" for DefaultCacheDir)
	CacheSize int64  // its bound

	OCI          oci.Options
	Mirrors      oci.MirrorConfig
	Jobs         int           // concurrent background fetches per mount
	FetchTimeout time.Duration // a read fails when a chunk takes longer

	WarmList            string // references to keep warm ("" for none)
	WarmStatus          string // where the warm status is written ("" for STATE-DIR/warm-status.json)
	WarmBandwidth       int64  // bytes per second warming may fetch (0: no bound)
	WarmResolveInterval time.Duration
	WarmJobs            int

	// Profile is the startup profile mode of mounts and warming
	// (profile.Options.Mode): "auto", "off" or "" (none).
	Profile string

	MetricsAddr string // where /metrics is served ("" for nowhere)
	// MetricsDigests labels the mount and warm metrics with digests and
	// references and serves /warm next to /metrics: whoever reaches the
	// address learns which versions the node holds. Off, the metrics are
	// totals and /warm is not served.
	MetricsDigests bool
	// Handoff is the socket where a successor takes this mounter's mounts
	// over ("" for STATE-DIR/mounter-handoff.sock).
	Handoff string
	// FDHolder is the fd holder's socket ("" for none; see ServeFDHolder).
	FDHolder string
	// Peers configures the peer tier (off when Peers.Listen is "").
	Peers  PeerConfig
	Logger *slog.Logger
}

// handoffSocket is where successors ask for the mounts.
func (c MounterProcess) handoffSocket() string {
	if c.Handoff != "" {
		return c.Handoff
	}
	return filepath.Join(c.StateDir, "mounter-handoff.sock")
}

// DefaultCacheDir is the node's cache directory when none is configured.
const DefaultCacheDir = "/var/lib/bdnvol/cache"

// chunksDir is where the node's chunk cache lives.
func (c MounterProcess) chunksDir() string {
	if c.CacheDir == "" {
		return filepath.Join(DefaultCacheDir, "chunks")
	}
	return filepath.Join(c.CacheDir, "chunks")
}

// indexesDir is where the node keeps the file indexes derived from
// ModelPack models (see modelpack.IndexCache).
func (c MounterProcess) indexesDir() string {
	return filepath.Join(filepath.Dir(c.chunksDir()), "indexes")
}

// ServeMounter runs the mounter over one shared chunk cache, with its
// warm list and metrics, until ctx ends; then it unmounts everything.
func ServeMounter(ctx context.Context, c MounterProcess) error {
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cache, err := chunkcache.Open(c.chunksDir(), c.CacheSize)
	if err != nil {
		return err
	}
	modelpack.UseIndexCache(modelpack.OpenIndexCache(c.indexesDir(), 0))
	met := metrics.New()
	met.Cache(cache)
	var peers func(oci.Ref, content.Fetcher) content.Fetcher
	if c.Peers.Listen != "" {
		if peers, err = startPeers(ctx, c.Peers, cache, met, log.With("component", "peer")); err != nil {
			return err
		}
	}
	var warmer *warm.Warmer
	if c.WarmList != "" {
		status := c.WarmStatus
		if status == "" {
			status = filepath.Join(c.StateDir, "warm-status.json")
		}
		warmer = warm.NewWarmer(warm.WarmerOptions{
			Options: warm.Options{OCI: c.OCI, Mirrors: c.Mirrors, Wrap: met.Wrap, Profile: nodeProfiles(c.Profile, cache, log), Peers: peers},
			Cache:   cache, ListFile: c.WarmList, StatusFile: status, Bandwidth: c.WarmBandwidth,
			ResolveInterval: c.WarmResolveInterval, Jobs: c.WarmJobs, Logger: log.With("component", "warm"),
		})
		met.Warm(warmer.Status, c.MetricsDigests)
	}
	m, err := NewMounter(MounterOptions{
		MountsDir: c.MountsDir, Cache: cache, OCI: c.OCI, Jobs: c.Jobs, FetchTimeout: c.FetchTimeout,
		Mirrors: c.Mirrors, Logger: log, Wrap: met.Wrap, Warmer: warmer, Profile: c.Profile,
		Handoff: c.handoffSocket(), FDHolder: c.FDHolder, Peers: peers,
	})
	if err != nil {
		return err
	}
	hl, err := listenFD(c.handoffSocket())
	if err != nil {
		m.Close()
		return err
	}
	go m.ServeHandoff(ctx, hl)
	go m.KeepHolder(ctx, time.Second)
	met.Mounts(func() []metrics.MountSample { return m.MountSamples(c.StateDir) }, c.MetricsDigests)
	if warmer != nil {
		go warmer.Run(ctx)
	}
	if c.MetricsAddr != "" {
		served := warmer
		if !c.MetricsDigests {
			served = nil // /warm lists every reference and digest of the warm list
		}
		if err := metrics.Serve(ctx, c.MetricsAddr, met, served, log); err != nil {
			return err
		}
	}
	l, err := Listen(c.Socket)
	if err != nil {
		m.Close()
		return err
	}
	srv := &http.Server{Handler: m.Handler()}
	go func() { <-ctx.Done(); srv.Close() }()
	log.Info("serving", "socket", c.Socket, "mounts_dir", c.MountsDir, "cache", cache.Dir(), "pid", os.Getpid(),
		"handoff", c.handoffSocket(), "fd_holder", c.FDHolder, "version", c.Version)
	if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
		return err
	}
	return m.Close()
}

// ServeNode serves the CSI Identity and Node services at endpoint until
// ctx ends. An empty opt.NodeID is the host name.
func ServeNode(ctx context.Context, endpoint string, opt NodeOptions) error {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.NodeID == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("node id: %w", err)
		}
		opt.NodeID = h
	}
	n, err := NewNode(ctx, opt)
	if err != nil {
		return err
	}
	l, err := Listen(endpoint)
	if err != nil {
		return err
	}
	opt.Logger.Info("serving", "endpoint", endpoint, "node_id", opt.NodeID, "pid", os.Getpid())
	if opt.WarmList != "" {
		go n.keepCompanionsWarm(ctx)
	}
	return n.Serve(ctx, l)
}
