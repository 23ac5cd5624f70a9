package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/metrics"
	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
	"github.com/bdnvol/bdnvol/pkg/versions"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// MountCmd mounts a version read-only with FUSE.
type MountCmd struct {
	Ref          string        `arg:"" name:"ref" help:"Version: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]. A tag is resolved once. With --spec: the root directory the spec's paths go under."`
	Mountpoint   string        `arg:"" optional:"" help:"Empty directory to mount on (not with --spec)."`
	Spec         string        `type:"existingfile" placeholder:"FILE" help:"Mount every entry of a deploy file (bdnvol.yaml) at ROOT/<path>, all served by this process."`
	Daemon       bool          `help:"Detach once the mount is ready; exit 0 only if it is."`
	CacheSize    Size          `name:"cache-size" default:"10GiB" help:"Bound of the shared chunk cache."`
	Prefetch     string        `default:"headers" help:"Fill the cache in the background: none, headers (safetensors headers), all, or comma-separated globs."`
	Jobs         int           `default:"8" help:"Concurrent background chunk fetches."`
	Profile      string        `default:"auto" placeholder:"auto|off|FILE" help:"Startup profile: auto fetches first what the node's stored profile of the version, else its referrer, lists (and records one when there is none); off; or a profile file."`
	FetchTimeout time.Duration `name:"fetch-timeout" default:"30s" help:"A read fails with EIO when a chunk takes longer to fetch."`
	AllowOther   bool          `name:"allow-other" help:"Let other users read the mount."`
	Debug        bool          `hidden:"" help:"Log every FUSE request."`
	Passthrough  bool          `default:"true" negatable:"" help:"Let the kernel read files whose chunks are all cached straight from a backing file in the cache (FUSE passthrough, Linux 6.9+, root); --no-passthrough serves every read through FUSE."`
	MetricsAddr  string        `name:"metrics-addr" placeholder:"HOST:PORT" help:"Serve Prometheus metrics at http://HOST:PORT/metrics while mounted."`
	MirrorFlags  `embed:""`

	RequireSignature string `name:"require-signature" type:"path" placeholder:"KEY" help:"Refuse a version unless it carries a valid signature by this cosign public key (with --spec: for mounts whose deploy file names no key)."`
}

func parseVersionRef(s string) (oci.Ref, error) {
	ref, err := versions.ParseRef(s)
	if err != nil {
		return ref, usageError{err}
	}
	return ref, nil
}

// Run mounts and serves until SIGINT, SIGTERM or `bdnvol umount`.
func (c *MountCmd) Run(ctx context.Context, g *Globals) error {
	targets, key, err := mountTargets(c.Ref, c.Mountpoint, c.Spec, c.RequireSignature, g.logf)
	if err != nil {
		return usageError{err}
	}
	prefetch, err := mounts.Prefetcher(c.Prefetch)
	if err != nil {
		return usageError{err}
	}
	if err := profile.CheckMode(c.Profile); err != nil {
		return usageError{fmt.Errorf("--profile: %w", err)}
	}
	if err := c.MirrorFlags.check(); err != nil {
		return err
	}
	store := g.mountStore()
	if c.Daemon && !mounts.IsDaemon() {
		return c.daemonize(ctx, g, store, key, targets)
	}
	ready, closeReady := mounts.Notifier()
	defer closeReady()
	if err := mounts.Prepare(store, targets, c.Spec != "", g.logf); err != nil {
		return err
	}
	cache, err := chunkcache.Open(filepath.Join(g.cacheDir(), "chunks"), int64(c.CacheSize))
	if err != nil {
		return err
	}
	met, err := metrics.ServeMount(ctx, c.MetricsAddr, cache, slog.New(slog.NewTextHandler(g.stderr, nil)))
	if err != nil {
		return usageError{err}
	}
	// A daemon takes the roots its starting process resolved, their
	// manifests and indexes in the cache by now (MountCmd.daemonize).
	targets = mounts.Handoff(ctx, targets, handoffWait)
	return mounts.Run(ctx, targets, mounts.RunOptions{
		Open: mounts.OpenOptions{
			OCI: g.options(), Mirrors: c.MirrorFlags.config(g), Cache: cache, Jobs: c.Jobs, FetchTimeout: c.FetchTimeout, Wrap: met.Wrap(),
			Profile: profile.Options{Mode: c.Profile, Store: profile.StoreIn(cache.Dir()), Logf: g.logf},
		},
		Serve: mounts.ServeOptions{
			AllowOther: c.AllowOther, UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Debug: c.Debug, NoPassthrough: !c.Passthrough, Store: &store, Logf: g.logf,
		},
		Prefetch: prefetch, PrefetchName: c.Prefetch,
		Hold: warm.HoldServed(cache, g.logf),
		Ready: func(all []*mounts.Served) {
			var pinned, digests []string
			for _, s := range all {
				digests = append(digests, s.Volume.Root().Digest.String())
				fmt.Fprintf(g.stderr, "bdnvol: serving %s at %s\n", s.Pinned, s.Mountpoint)
				fmt.Fprintln(g.stdout, s.Pinned)
				pinned = append(pinned, s.Pinned)
			}
			met.SetMounts(digests)
			ready(pinned)
		},
	})
}

// handoffWait bounds how long a daemon waits for the roots its starting
// process resolves before it resolves them itself.
const handoffWait = 30 * time.Second

// MirrorFlags choose registry mirrors for content fetched by digest.
type MirrorFlags struct {
	Mirror   []string `name:"mirror" sep:"none" placeholder:"URL" help:"Registry mirror to try first for chunks (repeatable, in order): a pull-through cache, Spegel, Dragonfly. Bytes are verified, so any mirror is safe; the registry is the fallback."`
	HostsDir string   `name:"hosts-dir" placeholder:"DIR" help:"containerd-style hosts directory: DIR/<registry host>/hosts.toml adds its pull hosts as mirrors (default /etc/containerd/certs.d when it exists; none to disable)."`
}

// config turns the flags into the mirrors to use; each failing mirror is
// reported once.
func (m MirrorFlags) config(g *Globals) oci.MirrorConfig {
	return oci.MirrorConfig{
		URLs: m.Mirror, HostsDir: m.HostsDir, CAFile: g.CAFile, SkipVerify: g.InsecureSkipVerify, Limiter: g.limiter,
		OnError: oci.OncePerMirror(func(mirror string, err error) {
			fmt.Fprintf(g.stderr, "bdnvol: mirror %s failed, using the registry (further failures of this mirror are not shown): %s\n", termsafe.Text(mirror), termsafe.Text(err.Error()))
		}),
	}
}

// daemonize starts this command again, detached, and waits until it reports
// that the mount is ready or fails.
func (c *MountCmd) daemonize(ctx context.Context, g *Globals, store mounts.Store, mp string, targets []mounts.Target) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// While the daemon starts (a process of its own, tens of ms), this
	// one resolves the references and fetches the manifests and indexes
	// the daemon's Open reads first into the shared cache, then hands the
	// daemon the roots resolved (mounts.Handoff); it stops when the daemon
	// is ready or failed. With --profile auto it also looks for each
	// version's profile referrer once the root is known, and hands the
	// outcome after the roots (the daemon replays it without asking the
	// registry). The daemon reports what goes wrong, so failing
	// mirrors are not reported here.
	pctx, stopPreload := context.WithCancel(ctx)
	defer stopPreload()
	preload := func() []mounts.Target {
		cache, err := chunkcache.Open(filepath.Join(g.cacheDir(), "chunks"), int64(c.CacheSize))
		if err != nil {
			return nil
		}
		mirrors := c.MirrorFlags.config(g)
		mirrors.OnError = nil
		prof := profile.Options{Mode: c.Profile, Store: profile.StoreIn(cache.Dir())}
		return mounts.Preload(pctx, targets, cache, mounts.OpenOptions{OCI: g.options(), Mirrors: mirrors, Profile: prof})
	}
	d, err := mounts.Daemonize(ctx, exe, os.Args[1:], store.LogPath(mp), preload)
	if err != nil {
		return err
	}
	if c.Spec == "" {
		fmt.Fprintf(g.stderr, "bdnvol: serving %s at %s (pid %d, log %s)\n", strings.Join(d.Pinned, " "), mp, d.PID, d.Log)
	} else {
		fmt.Fprintf(g.stderr, "bdnvol: serving %d versions under %s (pid %d, log %s)\n", len(d.Pinned), mp, d.PID, d.Log)
	}
	for _, p := range d.Pinned {
		fmt.Fprintln(g.stdout, p)
	}
	return nil
}

func (m MirrorFlags) check() error {
	if err := (oci.MirrorConfig{URLs: m.Mirror}).Check(); err != nil {
		return usageError{err}
	}
	return nil
}
