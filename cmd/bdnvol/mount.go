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

	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// readyFDEnv names the file descriptor on which a daemonised mount reports
// that it is ready.
const readyFDEnv = "BDNVOL_MOUNT_READY_FD"

// MountCmd mounts a version read-only with FUSE.
type MountCmd struct {
	Ref          string        `arg:"" help:"Version: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]. A tag is resolved once."`
	Mountpoint   string        `arg:"" type:"path" help:"Empty directory to mount on."`
	Daemon       bool          `help:"Detach once the mount is ready; exit 0 only if it is."`
	CacheSize    Size          `name:"cache-size" default:"10GiB" help:"Bound of the shared chunk cache."`
	Prefetch     string        `default:"headers" help:"Fill the cache in the background: none, headers (safetensors headers), all, or comma-separated globs."`
	Jobs         int           `default:"8" help:"Concurrent background chunk fetches."`
	FetchTimeout time.Duration `name:"fetch-timeout" default:"30s" help:"A read fails with EIO when a chunk takes longer to fetch."`
	AllowOther   bool          `name:"allow-other" help:"Let other users read the mount."`
	Debug        bool          `hidden:"" help:"Log every FUSE request."`
}

// Run mounts and serves until SIGINT, SIGTERM or `bdnvol umount`.
func (c *MountCmd) Run(ctx context.Context, g *Globals) error {
	ref, err := oci.ParseRef(c.Ref)
	if err != nil {
		return usageError{err}
	}
	if ref.Reference() == "" {
		return usageError{fmt.Errorf("%s: name a tag or a digest", c.Ref)}
	}
	prefetch, err := prefetchMatcher(c.Prefetch)
	if err != nil {
		return usageError{err}
	}
	mp, err := filepath.Abs(c.Mountpoint)
	if err != nil {
		return usageError{err}
	}
	if c.Daemon && os.Getenv(readyFDEnv) == "" {
		return c.daemonize(ctx, g, mp)
	}
	ready := func(string) {}
	if fd, err := strconv.Atoi(os.Getenv(readyFDEnv)); err == nil {
		pipe := os.NewFile(uintptr(fd), "ready")
		os.Unsetenv(readyFDEnv)
		ready = func(msg string) { fmt.Fprintln(pipe, msg); pipe.Close() }
		defer pipe.Close()
	}

	if err := c.clearMountpoint(g, mp); err != nil {
		return err
	}
	t, err := oci.Open(ctx, ref, g.options())
	if err != nil {
		return err
	}
	desc, err := oci.Resolve(ctx, t, ref)
	if err != nil {
		return err
	}
	cache, err := lazy.OpenCache(filepath.Join(g.cacheDir(), "chunks"), int64(c.CacheSize))
	if err != nil {
		return err
	}
	vol, err := lazy.Open(ctx, t, desc, lazy.Options{Cache: cache, Jobs: c.Jobs, FetchTimeout: c.FetchTimeout})
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	defer vol.Close()
	pinned := ref.Pinned(desc.Digest)
	server, err := lazy.Mount(mp, vol, lazy.MountOptions{
		AllowOther: c.AllowOther,
		UID:        uint32(os.Getuid()),
		GID:        uint32(os.Getgid()),
		Debug:      c.Debug,
	})
	if err != nil {
		return fmt.Errorf("mount %s on %s: %w", pinned, mp, err)
	}
	if err := g.writeState(mountState{Mountpoint: mp, Reference: pinned, Digest: desc.Digest.String(),
		PID: os.Getpid(), CacheDir: cache.Dir(), Started: time.Now().UTC()}); err != nil {
		fmt.Fprintf(g.stderr, "bdnvol: warning: cannot record the mount for `bdnvol mounts`: %v\n", err)
	}
	defer g.removeState(mp, os.Getpid())
	fmt.Fprintf(g.stderr, "bdnvol: serving %s at %s\n", pinned, mp)
	fmt.Fprintln(g.stdout, pinned)
	ready("ready " + pinned)

	var wg sync.WaitGroup
	pctx, stopPrefetch := context.WithCancel(ctx)
	defer func() { stopPrefetch(); wg.Wait() }()
	if prefetch != nil {
		wg.Go(func() {
			start := time.Now()
			if err := prefetch(pctx, vol); err != nil && pctx.Err() == nil {
				fmt.Fprintf(g.stderr, "bdnvol: prefetch: %v\n", err)
			} else if err == nil && c.Prefetch != "headers" {
				fmt.Fprintf(g.stderr, "bdnvol: prefetch %s done in %.1fs\n", c.Prefetch, time.Since(start).Seconds())
			}
		})
	}

	done := make(chan struct{})
	go func() { server.Wait(); close(done) }()
	select {
	case <-done:
		fmt.Fprintf(g.stderr, "bdnvol: %s was unmounted\n", mp)
		return nil
	case <-ctx.Done():
	}
	stopPrefetch()
	for i := 0; ; i++ {
		err := server.Unmount()
		if err == nil {
			break
		}
		if i == 20 {
			fmt.Fprintf(g.stderr, "bdnvol: %s is busy (%v); detaching it, it goes away when its last file is closed\n", mp, err)
			if err := detach(mp); err != nil {
				return fmt.Errorf("unmount %s: %w", mp, err)
			}
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	<-done
	fmt.Fprintf(g.stderr, "bdnvol: unmounted %s\n", mp)
	return nil
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
		if pinned, ok := strings.CutPrefix(s, "ready "); ok {
			fmt.Fprintf(g.stderr, "bdnvol: serving %s at %s (pid %d, log %s)\n", pinned, mp, cmd.Process.Pid, logPath)
			fmt.Fprintln(g.stdout, pinned)
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
