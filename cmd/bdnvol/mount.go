package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/deploy"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// readyFDEnv names the file descriptor on which a daemonised mount reports
// that it is ready.
const readyFDEnv = "BDNVOL_MOUNT_READY_FD"

// MountCmd mounts a version read-only with FUSE.
type MountCmd struct {
	Ref          string        `arg:"" name:"ref" help:"Version: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]. A tag is resolved once. With --spec: the root directory the spec's paths go under."`
	Mountpoint   string        `arg:"" optional:"" help:"Empty directory to mount on (not with --spec)."`
	Spec         string        `type:"existingfile" placeholder:"FILE" help:"Mount every entry of a deploy file (bdnvol.yaml) at ROOT/<path>, all served by this process."`
	Daemon       bool          `help:"Detach once the mount is ready; exit 0 only if it is."`
	CacheSize    Size          `name:"cache-size" default:"10GiB" help:"Bound of the shared chunk cache."`
	Prefetch     string        `default:"headers" help:"Fill the cache in the background: none, headers (safetensors headers), all, or comma-separated globs."`
	Jobs         int           `default:"8" help:"Concurrent background chunk fetches."`
	FetchTimeout time.Duration `name:"fetch-timeout" default:"30s" help:"A read fails with EIO when a chunk takes longer to fetch."`
	AllowOther   bool          `name:"allow-other" help:"Let other users read the mount."`
	Debug        bool          `hidden:"" help:"Log every FUSE request."`
	MirrorFlags  `embed:""`
}

// mountJob is one version to mount at one mountpoint.
type mountJob struct {
	ref oci.Ref
	mp  string
}

// served is one mounted version.
type served struct {
	job    mountJob
	vol    *lazy.Volume
	server *fuse.Server
	pinned string
	done   chan struct{}
}

// jobs turns the arguments into what to mount, and the directory the
// daemon's log is named after.
func (c *MountCmd) jobs(g *Globals) ([]mountJob, string, error) {
	if c.Spec == "" {
		if c.Mountpoint == "" {
			return nil, "", usageError{errors.New("expected REF MOUNTPOINT, or --spec FILE ROOT")}
		}
		ref, err := parseVersionRef(c.Ref)
		if err != nil {
			return nil, "", err
		}
		mp, err := filepath.Abs(c.Mountpoint)
		if err != nil {
			return nil, "", usageError{err}
		}
		return []mountJob{{ref, mp}}, mp, nil
	}
	if c.Mountpoint != "" {
		return nil, "", usageError{errors.New("with --spec, give only the root directory")}
	}
	root, err := filepath.Abs(c.Ref)
	if err != nil {
		return nil, "", usageError{err}
	}
	b, err := os.ReadFile(c.Spec)
	if err != nil {
		return nil, "", usageError{err}
	}
	spec, err := deploy.Parse(b)
	if err != nil {
		return nil, "", usageError{fmt.Errorf("%s: %w", c.Spec, err)}
	}
	var jobs []mountJob
	for _, m := range spec.Mounts {
		ref, err := parseVersionRef(m.Source)
		if err != nil {
			return nil, "", usageError{fmt.Errorf("%s: %w", c.Spec, err)}
		}
		if !m.ReadOnly {
			fmt.Fprintf(g.stderr, "bdnvol: %s: %s is mounted read-only (bdnvol mounts are always read-only)\n", c.Spec, m.Path)
		}
		jobs = append(jobs, mountJob{ref, filepath.Join(root, filepath.FromSlash(m.Path))})
	}
	for _, a := range jobs {
		for _, b := range jobs {
			if a.mp != b.mp && strings.HasPrefix(b.mp, a.mp+string(filepath.Separator)) {
				return nil, "", usageError{fmt.Errorf("%s: %s is inside %s; nested mounts are not supported", c.Spec, b.mp, a.mp)}
			}
		}
	}
	return jobs, root, nil
}

func parseVersionRef(s string) (oci.Ref, error) {
	ref, err := oci.ParseRef(s)
	if err != nil {
		return ref, usageError{err}
	}
	if ref.Reference() == "" {
		return ref, usageError{fmt.Errorf("%s: name a tag or a digest", s)}
	}
	return ref, nil
}

// Run mounts and serves until SIGINT, SIGTERM or `bdnvol umount`.
func (c *MountCmd) Run(ctx context.Context, g *Globals) error {
	jobs, key, err := c.jobs(g)
	if err != nil {
		return err
	}
	prefetch, err := prefetchMatcher(c.Prefetch)
	if err != nil {
		return usageError{err}
	}
	if err := c.MirrorFlags.check(); err != nil {
		return err
	}
	if c.Daemon && os.Getenv(readyFDEnv) == "" {
		return c.daemonize(ctx, g, key)
	}
	ready := func(string) {}
	if fd, err := strconv.Atoi(os.Getenv(readyFDEnv)); err == nil {
		pipe := os.NewFile(uintptr(fd), "ready")
		os.Unsetenv(readyFDEnv)
		ready = func(msg string) { fmt.Fprintln(pipe, msg); pipe.Close() }
		defer pipe.Close()
	}

	for _, j := range jobs {
		if c.Spec != "" {
			if err := os.MkdirAll(j.mp, 0o755); err != nil && !isNotConnected(j.mp) {
				return fmt.Errorf("mountpoint: %w", err)
			}
		}
		if err := c.clearMountpoint(g, j.mp); err != nil {
			return err
		}
	}
	cache, err := lazy.OpenCache(filepath.Join(g.cacheDir(), "chunks"), int64(c.CacheSize))
	if err != nil {
		return err
	}
	var all []*served
	defer func() {
		for _, s := range all {
			s.vol.Close()
		}
	}()
	for _, j := range jobs {
		s, err := c.mountOne(ctx, g, j, cache)
		if err != nil {
			for _, s := range all {
				c.unmount(g, s)
			}
			return err
		}
		all = append(all, s)
	}
	var pinned []string
	for _, s := range all {
		fmt.Fprintf(g.stderr, "bdnvol: serving %s at %s\n", s.pinned, s.job.mp)
		fmt.Fprintln(g.stdout, s.pinned)
		pinned = append(pinned, s.pinned)
	}
	ready("ready " + strings.Join(pinned, " "))

	var wg sync.WaitGroup
	pctx, stopPrefetch := context.WithCancel(ctx)
	defer func() { stopPrefetch(); wg.Wait() }()
	if prefetch != nil {
		for _, s := range all {
			wg.Go(func() {
				start := time.Now()
				if err := prefetch(pctx, s.vol); err != nil && pctx.Err() == nil {
					fmt.Fprintf(g.stderr, "bdnvol: prefetch %s: %s\n", s.job.mp, termsafe.Text(err.Error()))
				} else if err == nil && c.Prefetch != "headers" {
					fmt.Fprintf(g.stderr, "bdnvol: prefetch %s of %s done in %.1fs\n", c.Prefetch, s.job.mp, time.Since(start).Seconds())
				}
			})
		}
	}

	// Serve until every mount is gone or a signal asks to stop.
	gone := make(chan *served, len(all))
	for _, s := range all {
		go func() { <-s.done; gone <- s }()
	}
	left := len(all)
	for left > 0 {
		select {
		case s := <-gone:
			left--
			g.removeState(s.job.mp, os.Getpid())
			fmt.Fprintf(g.stderr, "bdnvol: %s was unmounted\n", s.job.mp)
			continue
		case <-ctx.Done():
		}
		break
	}
	if left == 0 {
		return nil
	}
	stopPrefetch()
	for _, s := range all {
		select {
		case <-s.done:
		default:
			if err := c.unmount(g, s); err != nil {
				return err
			}
			fmt.Fprintf(g.stderr, "bdnvol: unmounted %s\n", s.job.mp)
		}
	}
	return nil
}

// mountOne resolves j's reference, opens the version and mounts it.
func (c *MountCmd) mountOne(ctx context.Context, g *Globals, j mountJob, cache *lazy.Cache) (*served, error) {
	t, err := oci.Open(ctx, j.ref, g.options())
	if err != nil {
		return nil, err
	}
	desc, err := oci.Resolve(ctx, t, j.ref)
	if err != nil {
		return nil, err
	}
	src, _, err := c.MirrorFlags.fetcher(g, j.ref, t)
	if err != nil {
		return nil, err
	}
	vol, err := lazy.Open(ctx, src, desc, lazy.Options{Cache: cache, Jobs: c.Jobs, FetchTimeout: c.FetchTimeout})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", j.ref, err)
	}
	pinned := j.ref.Pinned(desc.Digest)
	server, err := lazy.Mount(j.mp, vol, lazy.MountOptions{
		AllowOther: c.AllowOther,
		UID:        uint32(os.Getuid()),
		GID:        uint32(os.Getgid()),
		Debug:      c.Debug,
	})
	if err != nil {
		vol.Close()
		return nil, fmt.Errorf("mount %s on %s: %w", pinned, j.mp, err)
	}
	if err := g.writeState(mountState{Mountpoint: j.mp, Reference: pinned, Digest: desc.Digest.String(),
		PID: os.Getpid(), CacheDir: cache.Dir(), Started: time.Now().UTC()}); err != nil {
		fmt.Fprintf(g.stderr, "bdnvol: warning: cannot record the mount for `bdnvol mounts`: %v\n", err)
	}
	s := &served{job: j, vol: vol, server: server, pinned: pinned, done: make(chan struct{})}
	go func() { server.Wait(); close(s.done) }()
	return s, nil
}

// unmount unmounts s, detaching it lazily when it stays busy, waits until
// it is gone and removes its state.
func (c *MountCmd) unmount(g *Globals, s *served) error {
	defer g.removeState(s.job.mp, os.Getpid())
	for i := 0; ; i++ {
		err := s.server.Unmount()
		if err == nil {
			break
		}
		if i == 20 {
			fmt.Fprintf(g.stderr, "bdnvol: %s is busy (%v); detaching it, it goes away when its last file is closed\n", s.job.mp, err)
			if err := detach(s.job.mp); err != nil {
				return fmt.Errorf("unmount %s: %w", s.job.mp, err)
			}
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	<-s.done
	return nil
}

// MirrorFlags choose registry mirrors for content fetched by digest.
type MirrorFlags struct {
	Mirror   []string `name:"mirror" sep:"none" placeholder:"URL" help:"Registry mirror to try first for chunks (repeatable, in order): a pull-through cache, Spegel, Dragonfly. Bytes are verified, so any mirror is safe; the registry is the fallback."`
	HostsDir string   `name:"hosts-dir" placeholder:"DIR" help:"containerd-style hosts directory: DIR/<registry host>/hosts.toml adds its pull hosts as mirrors (default /etc/containerd/certs.d when it exists; none to disable)."`
}

func (m MirrorFlags) check() error {
	for _, u := range m.Mirror {
		if _, err := lazy.ParseMirrorURL(u); err != nil {
			return usageError{err}
		}
	}
	return nil
}

// mirrorTimeout bounds how long a mirror may take to answer before the
// next one, or the registry, is tried.
const mirrorTimeout = 5 * time.Second

// fetcher returns src wrapped with the mirrors configured for ref's
// registry, and the mirror fetcher (nil when there are none).
func (m MirrorFlags) fetcher(g *Globals, ref oci.Ref, src lazy.Fetcher) (lazy.Fetcher, *lazy.MirrorFetcher, error) {
	if ref.Layout != "" {
		if len(m.Mirror) > 0 {
			fmt.Fprintf(g.stderr, "bdnvol: %s is a local layout; --mirror is not used\n", ref.Repo())
		}
		return src, nil, nil
	}
	var hosts []lazy.HostEntry
	for _, u := range m.Mirror {
		h := lazy.HostEntry{URL: u, SkipVerify: g.InsecureSkipVerify}
		if g.CAFile != "" {
			h.CA = []string{g.CAFile}
		}
		hosts = append(hosts, h)
	}
	dir := m.HostsDir
	if dir == "" {
		if _, err := os.Stat(lazy.DefaultHostsDir); err == nil {
			dir = lazy.DefaultHostsDir
		}
	}
	if dir != "" && dir != "none" {
		cfg, err := lazy.LoadHostsConfig(dir, ref.Registry)
		if err != nil {
			return nil, nil, err
		}
		hosts = append(hosts, cfg.Mirrors(ref.Registry)...)
	}
	if len(hosts) == 0 {
		return src, nil, nil
	}
	mirrors := make([]lazy.Mirror, 0, len(hosts))
	for _, h := range hosts {
		mr, err := h.Mirror(mirrorTimeout)
		if err != nil {
			return nil, nil, err
		}
		mirrors = append(mirrors, mr)
	}
	var reported sync.Map
	mf, err := lazy.NewMirrorFetcher(src, mirrors, lazy.MirrorOptions{
		Registry:   ref.Registry,
		Repository: ref.Repository,
		Timeout:    mirrorTimeout,
		OnError: func(mirror string, desc ocispec.Descriptor, err error) {
			if _, seen := reported.LoadOrStore(mirror, true); !seen {
				fmt.Fprintf(g.stderr, "bdnvol: mirror %s failed, using the registry (further failures of this mirror are not shown): %v\n", mirror, err)
			}
		},
	})
	if err != nil {
		return nil, nil, usageError{err}
	}
	return mf, mf, nil
}

// prefetchMatcher turns --prefetch into the background work to start.
func prefetchMatcher(s string) (func(context.Context, *lazy.Volume) error, error) {
	switch s {
	case "none", "":
		return nil, nil
	case "headers":
		return func(ctx context.Context, v *lazy.Volume) error { return v.PrefetchHeaders(ctx) }, nil
	case "all":
		return func(ctx context.Context, v *lazy.Volume) error {
			if err := v.PrefetchHeaders(ctx); err != nil {
				return err
			}
			return v.Prefetch(ctx, nil)
		}, nil
	}
	m, err := lazy.MatchGlobs(s)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, v *lazy.Volume) error {
		if err := v.PrefetchHeaders(ctx); err != nil {
			return err
		}
		return v.Prefetch(ctx, m)
	}, nil
}

// clearMountpoint checks that mp is a directory to mount on, cleaning a
// stale bdnvol mount left by a killed process.
func (c *MountCmd) clearMountpoint(g *Globals, mp string) error {
	m, mounted := mountedAt(mp)
	st, _ := g.readState(mp)
	switch {
	case mounted && st.PID != 0 && st.PID != os.Getpid() && alive(st.PID) && !isNotConnected(mp):
		return fmt.Errorf("%s: already mounted by bdnvol (pid %d, serving %s); run `bdnvol umount %s` first", mp, st.PID, m.Digest, mp)
	case mounted || isNotConnected(mp):
		who := "its process is gone"
		if st.PID != 0 {
			who = fmt.Sprintf("its process %d is gone", st.PID)
		}
		if err := detach(mp); err != nil {
			return fmt.Errorf("%s: stale mount (%s) could not be removed: %w", mp, who, err)
		}
		g.removeState(mp, 0)
		fmt.Fprintf(g.stderr, "bdnvol: %s: removed a stale bdnvol mount of %s (%s)\n", mp, m.Digest, who)
	}
	fi, err := os.Stat(mp)
	if err != nil {
		return fmt.Errorf("mountpoint: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("mountpoint %s: not a directory", mp)
	}
	return nil
}

// daemonize starts this command again, detached, and waits until it reports
// that the mount is ready or fails.
func (c *MountCmd) daemonize(ctx context.Context, g *Globals, mp string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(g.stateDir(), 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(g.stateDir(), stateKey(mp)+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = append(os.Environ(), readyFDEnv+"=3")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return fmt.Errorf("start the mount daemon: %w", err)
	}
	pw.Close()
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(pr).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		if rest, ok := strings.CutPrefix(s, "ready "); ok {
			pinned := strings.Fields(rest)
			if c.Spec == "" {
				fmt.Fprintf(g.stderr, "bdnvol: serving %s at %s (pid %d, log %s)\n", rest, mp, cmd.Process.Pid, logPath)
			} else {
				fmt.Fprintf(g.stderr, "bdnvol: serving %d versions under %s (pid %d, log %s)\n", len(pinned), mp, cmd.Process.Pid, logPath)
			}
			for _, p := range pinned {
				fmt.Fprintln(g.stdout, p)
			}
			return nil
		}
	case <-ctx.Done():
		cmd.Process.Signal(syscall.SIGTERM)
		return ctx.Err()
	}
	<-exited
	b, _ := os.ReadFile(logPath)
	msg := strings.TrimSpace(string(b))
	msg = strings.TrimPrefix(msg[strings.LastIndex(msg, "\n")+1:], "bdnvol: ")
	if msg == "" {
		msg = "exited before the mount was ready"
	}
	return errors.New(msg)
}
