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
	"github.com/bdnvol/bdnvol/pkg/mounts"
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
	m, err := csi.NewMounter(csi.MounterOptions{
		MountsDir: c.MountsDir, Cache: cache, OCI: g.options(), Jobs: c.Jobs, FetchTimeout: c.FetchTimeout,
		Mirrors: mounts.MirrorConfig{HostsDir: c.HostsDir, CAFile: g.CAFile, SkipVerify: g.InsecureSkipVerify},
		Logger:  log,
	})
	if err != nil {
		return err
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
