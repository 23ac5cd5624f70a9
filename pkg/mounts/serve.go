package mounts

import (
	"fmt"
	"os"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/bdnvol/bdnvol/internal/proc"
	"github.com/bdnvol/bdnvol/pkg/lazy"
)

// ServeOptions configure Serve. Zero values select defaults.
type ServeOptions struct {
	AllowOther bool   // let other users read the mount
	UID, GID   uint32 // owner of every entry; 0 means root
	Debug      bool   // log every FUSE request
	// NoPassthrough serves every read through FUSE (lazy.MountOptions).
	NoPassthrough bool
	// Store records the mount's State when not nil.
	Store *Store
	// CacheDir is the chunk cache recorded in the State.
	CacheDir string
	// Logf reports what the caller may want to show (warnings, detaching a
	// busy mount); nil discards it.
	Logf func(format string, args ...any)
}

func (o ServeOptions) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Served is one version served at one mountpoint by this process.
type Served struct {
	Mountpoint string
	Pinned     string // the digest-pinned reference served
	Volume     *lazy.Volume
	opt        ServeOptions
	server     *fuse.Server
	conn       string // the FUSE connection (fusectl's name), "" if unknown
	done       chan struct{}
}

// Serve mounts vol read-only at mp and serves it until it is unmounted.
// pinned is the reference recorded for it. It returns once the mount is
// ready.
func Serve(mp string, vol *lazy.Volume, pinned string, opt ServeOptions) (*Served, error) {
	server, err := lazy.Mount(mp, vol, lazy.MountOptions{AllowOther: opt.AllowOther, UID: opt.UID, GID: opt.GID, Debug: opt.Debug, NoPassthrough: opt.NoPassthrough})
	if err != nil {
		return nil, fmt.Errorf("mount %s on %s: %w", pinned, mp, err)
	}
	if opt.Store != nil {
		st := State{Mountpoint: mp, Reference: pinned, Digest: vol.Root().Digest.String(), PID: os.Getpid(),
			CacheDir: opt.CacheDir, Started: time.Now().UTC()}
		if err := opt.Store.Write(st); err != nil {
			opt.logf("warning: cannot record the mount for `bdnvol mounts`: %v", err)
		}
	}
	s := &Served{Mountpoint: mp, Pinned: pinned, Volume: vol, opt: opt, server: server, conn: connOf(mp), done: make(chan struct{})}
	go func() {
		server.Wait()
		if opt.Store != nil {
			opt.Store.Remove(mp, os.Getpid())
		}
		close(s.done)
	}()
	return s, nil
}

// Done is closed once the mount is gone, however it went.
func (s *Served) Done() <-chan struct{} { return s.done }

// busyFor is how long Unmount tries a clean unmount of a busy mount
// before it detaches it.
const busyFor = 5 * time.Second

// abortAfter is how long Unmount waits for the server to end once the
// mountpoint is gone; then it aborts the FUSE connection.
const abortAfter = 2 * time.Second

// Unmount unmounts s, detaching it lazily when it stays busy for busyFor,
// and waits until it is gone and its state removed; a server that another
// mount of the same connection (a bind mount) keeps going is aborted after
// abortAfter, one that open files keep going after busyFor more. The
// volume stays open.
func (s *Served) Unmount() error { return s.unmount(busyFor, abortAfter) }

// Stop unmounts s at once: detached if it is still busy after grace, its
// FUSE connection aborted if its server still runs grace after that. The
// volume stays open.
func (s *Served) Stop(grace time.Duration) error { return s.unmount(grace, grace) }

func (s *Served) unmount(busy, wait time.Duration) error {
	giveUp := time.Now().Add(busy)
	for {
		err := s.serverUnmount(wait)
		if err == nil {
			// Gone from its mountpoint, and serverUnmount waited for
			// its server already: abort what still keeps it.
			return s.wait(0, wait)
		}
		if time.Now().After(giveUp) {
			s.opt.logf("%s is busy (%v); detaching it: files open in it read on for %v at most", s.Mountpoint, err, busy)
			if err := Detach(s.Mountpoint); err != nil {
				return fmt.Errorf("unmount %s: %w", s.Mountpoint, err)
			}
			return s.wait(busy, wait)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// serverUnmount is the FUSE server's Unmount, which unmounts the
// mountpoint (failing when it is busy) and then waits for the server's
// loops to end: bounded here by wait, as another mount of the connection
// keeps them going for ever.
func (s *Served) serverUnmount(wait time.Duration) error {
	res := make(chan error, 1)
	go func() { res <- s.server.Unmount() }()
	select {
	case err := <-res:
		return err
	case <-s.done:
		return nil
	case <-time.After(wait):
		if _, mounted := At(s.Mountpoint); mounted {
			return fmt.Errorf("unmount %s: still mounted after %v", s.Mountpoint, wait)
		}
		return nil // unmounted; what keeps it served is aborted next
	}
}

// wait waits up to first for the server to end, then aborts its FUSE
// connection and waits up to then again.
func (s *Served) wait(first, then time.Duration) error {
	t := time.NewTimer(first)
	defer t.Stop()
	select {
	case <-s.done:
		return nil
	default:
		select {
		case <-s.done:
			return nil
		case <-t.C:
		}
	}
	err := abortConn(s.conn)
	if err == nil {
		s.opt.logf("%s: still in use after unmount (bound elsewhere); aborted its FUSE connection %s", s.Mountpoint, s.conn)
	}
	select {
	case <-s.done:
		return nil
	case <-time.After(then):
		return fmt.Errorf("unmount %s: the server did not end (abort: %v)", s.Mountpoint, err)
	}
}

// Clear checks that mp is a directory to mount on, removing a stale bdnvol
// mount there whose process is gone. It fails when a live process serves
// mp. Removals are reported to logf (nil: not reported).
func (s Store) Clear(mp string, logf func(format string, args ...any)) error {
	m, mounted := At(mp)
	st, _ := s.Read(mp)
	switch {
	case mounted && st.PID != 0 && st.PID != os.Getpid() && proc.Alive(st.PID, "") && !NotConnected(mp):
		return fmt.Errorf("%s: already mounted by bdnvol (pid %d, serving %s); run `bdnvol umount %s` first", mp, st.PID, m.Digest, mp)
	case mounted || NotConnected(mp):
		who := "its process is gone"
		if st.PID != 0 {
			who = fmt.Sprintf("its process %d is gone", st.PID)
		}
		if err := Detach(mp); err != nil {
			return fmt.Errorf("%s: stale mount (%s) could not be removed: %w", mp, who, err)
		}
		s.Remove(mp, 0)
		if logf != nil {
			logf("%s: removed a stale bdnvol mount of %s (%s)", mp, m.Digest, who)
		}
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
