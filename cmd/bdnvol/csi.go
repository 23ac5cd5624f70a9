package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/bdnvol/bdnvol/pkg/csi"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/metrics"
	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// CSICmd runs the Kubernetes CSI node plugin's two processes.
type CSICmd struct {
	Mounter CSIMounterCmd `cmd:"" help:"Hold one FUSE mount per digest on this node over one shared chunk cache; serve the node plugin on a unix socket."`
	Node    CSINodeCmd    `cmd:"" help:"Serve the CSI Identity and Node services to kubelet, mounting through the mounter."`
}

// csiDirs are the flags both processes take.
type csiDirs struct {
	StateDir      string `name:"state-dir" default:"/var/lib/bdnvol/csi" help:"Where the plugin records what it published."`
	MountsDir     string `name:"mounts-dir" default:"/var/lib/kubelet/plugins/csi.bdnvol.dev/mounts" help:"Where the per-digest FUSE mounts live (under the kubelet directory, so propagation shares them)."`
	MounterSocket string `name:"mounter-socket" default:"/var/lib/kubelet/plugins/csi.bdnvol.dev/mounter.sock" help:"The mounter's unix socket."`
}

// defaultCSICacheDir is the node's chunk cache when --cache-dir is not given.
const defaultCSICacheDir = "/var/lib/bdnvol/cache"

// CSIMounterCmd is `bdnvol csi mounter`.
type CSIMounterCmd struct {
	csiDirs      `embed:""`
	CacheSize    Size          `name:"cache-size" default:"50GiB" help:"Bound of the chunk cache (least recently used chunks go first)."`
	HostsDir     string        `name:"hosts-dir" placeholder:"DIR" help:"containerd-style hosts directory for registry mirrors (none to disable)."`
	Jobs         int           `default:"8" help:"Concurrent background chunk fetches per mount."`
	FetchTimeout time.Duration `name:"fetch-timeout" default:"30s" help:"A read fails with EIO when a chunk takes longer to fetch."`

	WarmList            string        `name:"warm-list" placeholder:"FILE" help:"Keep the references in FILE warm in the cache (one 'REF [GLOBS]' per line; re-read when it changes)."`
	WarmBandwidth       Size          `name:"warm-bandwidth" default:"0" help:"Bytes per second warming may fetch (0: no bound)."`
	WarmResolveInterval time.Duration `name:"warm-resolve-interval" default:"5m" help:"How often tags in the warm list are resolved again."`
	WarmStatus          string        `name:"warm-status" placeholder:"FILE" help:"Where the warm status is written (default STATE-DIR/warm-status.json)."`
	WarmJobs            int           `name:"warm-jobs" default:"4" help:"Concurrent chunk fetches for warming."`
	MetricsAddr         string        `name:"metrics-addr" placeholder:"HOST:PORT" help:"Serve Prometheus metrics (/metrics) and the warm status (/warm) at this address."`
}

// Run serves until SIGTERM, then unmounts everything.
func (c *CSIMounterCmd) Run(ctx context.Context, g *Globals) error {
	log := slog.New(slog.NewJSONHandler(g.stderr, nil)).With("component", "mounter")
	// The global --cache-dir names the node's chunk cache, shared by every mount.
	dir := g.CacheDir
	if dir == "" {
		dir = defaultCSICacheDir
	}
	cache, err := lazy.OpenCache(filepath.Join(dir, "chunks"), int64(c.CacheSize))
	if err != nil {
		return err
	}
	met := metrics.New()
	met.Cache(cache)
	mirrors := mounts.MirrorConfig{HostsDir: c.HostsDir, CAFile: g.CAFile, SkipVerify: g.InsecureSkipVerify}
	var warmer *warm.Warmer
	if c.WarmList != "" {
		status := c.WarmStatus
		if status == "" {
			status = filepath.Join(c.StateDir, "warm-status.json")
		}
		warmer = warm.NewWarmer(warm.WarmerOptions{
			Options: warm.Options{OCI: g.options(), Mirrors: mirrors, Wrap: met.Wrap},
			Cache:   cache, ListFile: c.WarmList, StatusFile: status, Bandwidth: int64(c.WarmBandwidth),
			ResolveInterval: c.WarmResolveInterval, Jobs: c.WarmJobs, Logger: log.With("component", "warm"),
		})
		met.Warm(warmer.Status)
	}
	m, err := csi.NewMounter(csi.MounterOptions{
		MountsDir: c.MountsDir, Cache: cache, OCI: g.options(), Jobs: c.Jobs, FetchTimeout: c.FetchTimeout,
		Mirrors: mirrors, Logger: log, Wrap: met.Wrap, Warmer: warmer,
	})
	if err != nil {
		return err
	}
	met.Mounts(func() []metrics.MountSample { return m.MountSamples(c.StateDir) })
	if warmer != nil {
		go warmer.Run(ctx)
	}
	if c.MetricsAddr != "" {
		if err := metrics.Serve(ctx, c.MetricsAddr, met, warmer, log); err != nil {
			return err
		}
	}
	l, err := csi.Listen(c.MounterSocket)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: m.Handler()}
	go func() { <-ctx.Done(); srv.Close() }()
	log.Info("serving", "socket", c.MounterSocket, "mounts_dir", c.MountsDir, "cache", cache.Dir(), "pid", os.Getpid())
	if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
		return err
	}
	return m.Close()
}

// CSINodeCmd is `bdnvol csi node`.
type CSINodeCmd struct {
	csiDirs  `embed:""`
	Endpoint string        `default:"unix:///csi/csi.sock" help:"The CSI socket kubelet calls."`
	NodeID   string        `name:"node-id" env:"NODE_NAME" help:"This node's name (default: the host name)."`
	Linger   time.Duration `default:"2m" help:"How long a digest stays mounted after its last pod is gone."`
}

// Run serves the CSI services until SIGTERM.
func (c *CSINodeCmd) Run(ctx context.Context, g *Globals) error {
	log := slog.New(slog.NewJSONHandler(g.stderr, nil)).With("component", "node")
	id := c.NodeID
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("node id: %w", err)
		}
		id = h
	}
	n, err := csi.NewNode(ctx, csi.NodeOptions{
		NodeID: id, Version: version, StateDir: c.StateDir, Linger: c.Linger,
		Mounter: csi.NewMounterClient(c.MounterSocket), OCI: g.options(), Logger: log,
	})
	if err != nil {
		return err
	}
	l, err := csi.Listen(c.Endpoint)
	if err != nil {
		return err
	}
	log.Info("serving", "endpoint", c.Endpoint, "node_id", id, "pid", os.Getpid())
	return n.Serve(ctx, l)
}
