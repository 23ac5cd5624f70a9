package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/bdnvol/bdnvol/pkg/mounts"
)

// DefaultFDHolderSocket is where `bdnvol csi fd-holder` listens and where
// `bdnvol csi mounter --fd-holder` finds it unless told otherwise.
const DefaultFDHolderSocket = "/var/lib/bdnvol/csi/fdholder.sock"

// FDHolderOptions configure ServeFDHolder.
type FDHolderOptions struct {
	Socket string // the unix socket mounters connect to
	// MountsDir is the mounter's mounts directory: a mount put whose
	// mountpoint is not directly in it is refused, as is one whose
	// descriptor is not /dev/fuse, so that the holder never detaches
	// another path.
	MountsDir string
	// DetachAfter is how long a holder stopped with no mounter connected
	// waits for one before it detaches the mounts it holds; 0 is 10s.
	DetachAfter time.Duration
	Logger      *slog.Logger
}

// fdHolder keeps a copy of each mount's master descriptor for the
// mounter, so that the FUSE connections outlive a mounter that crashes
// and a new mounter can serve them.
type fdHolder struct {
	log       *slog.Logger
	mountsDir string

	mu       sync.Mutex
	held     map[string]*heldFD // by mount key
	mounters int                // connections that said hello
	arrived  chan struct{}      // closed and replaced whenever a mounter says hello
}

// heldFD is one mount the holder keeps.
type heldFD struct {
	m heldMount
	f *os.File
}

// ServeFDHolder holds mounts' descriptors for mounters until ctx ends.
// Then, if no mounter is connected, it waits up to opt.DetachAfter for
// one; if none comes, it detaches (lazily unmounts) every mount it holds,
// whose readers then see ENOTCONN. Either way it closes its copies.
func ServeFDHolder(ctx context.Context, opt FDHolderOptions) error {
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opt.DetachAfter <= 0 {
		opt.DetachAfter = 10 * time.Second
	}
	if opt.MountsDir == "" || !filepath.IsAbs(opt.MountsDir) {
		return fmt.Errorf("fd holder: mounts directory %q: not an absolute path", opt.MountsDir)
	}
	l, err := listenFD(opt.Socket)
	if err != nil {
		return err
	}
	h := &fdHolder{log: log, mountsDir: filepath.Clean(opt.MountsDir), held: map[string]*heldFD{}, arrived: make(chan struct{})}
	var conns sync.WaitGroup
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				h.serve(c)
			}()
		}
	}()
	log.Info("holding", "socket", opt.Socket, "pid", os.Getpid())
	<-ctx.Done()
	h.mu.Lock()
	n, arrived, held := h.mounters, h.arrived, len(h.held)
	h.mu.Unlock()
	if n == 0 && held > 0 {
		log.Info("stopping with no mounter connected: waiting for one", "mounts", held, "for", opt.DetachAfter.String())
		select {
		case <-arrived:
		case <-time.After(opt.DetachAfter):
		}
	} else if held > 0 {
		// A mounter stopping with the holder (an uninstall, both pods
		// deleted) leaves its mounts to it: were the holder to go first,
		// nobody would serve or detach them. Wait for the mounters to stay
		// or go; if they all go, detach below.
		log.Info("stopping with a mounter connected: waiting to see it stay", "mounts", held, "for", opt.DetachAfter.String())
		for deadline := time.Now().Add(opt.DetachAfter); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			h.mu.Lock()
			gone := h.mounters == 0
			h.mu.Unlock()
			if gone {
				break
			}
		}
	}
	l.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mounters == 0 {
		for key, e := range h.held {
			if err := mounts.Detach(e.m.Mountpoint); err != nil {
				log.Warn("detach", "mount", key, "path", e.m.Mountpoint, "error", err.Error())
			} else {
				log.Info("no mounter: detached", "mount", key, "path", e.m.Mountpoint)
			}
		}
	}
	for key, e := range h.held {
		e.f.Close()
		delete(h.held, key)
	}
	return nil
}

// serve answers one mounter's connection.
func (h *fdHolder) serve(c *net.UnixConn) {
	defer c.Close()
	if err := checkPeer(c); err != nil {
		h.log.Warn("connection refused", "error", err.Error())
		return
	}
	hello := false
	defer func() {
		if hello {
			h.mu.Lock()
			h.mounters--
			h.mu.Unlock()
		}
	}()
	for {
		m, f, err := readFD(c)
		if err != nil {
			if errors.Is(err, errFDProto) {
				h.log.Warn("bad message", "error", err.Error())
				writeFD(c, fdMessage{Op: opError, Error: err.Error()}, nil)
			}
			return
		}
		if !hello && m.Op != opHello {
			writeFD(c, fdMessage{Op: opError, Error: "hello first"}, nil)
			if f != nil {
				f.Close()
			}
			return
		}
		var werr error
		switch m.Op {
		case opHello:
			if !hello {
				hello = true
				h.mu.Lock()
				h.mounters++
				close(h.arrived)
				h.arrived = make(chan struct{})
				h.mu.Unlock()
			}
			werr = writeFD(c, fdMessage{Op: opOK}, nil)
		case opPut:
			if err := errors.Join(checkHeldMount(*m.Mount, h.mountsDir), checkFUSE(f)); err != nil {
				f.Close()
				h.log.Warn("mount refused", "mount", m.Mount.String(), "error", err.Error())
				werr = writeFD(c, fdMessage{Op: opError, Error: err.Error()}, nil)
				break
			}
			h.mu.Lock()
			if old, ok := h.held[m.Mount.Key]; ok {
				old.f.Close()
			}
			h.held[m.Mount.Key] = &heldFD{m: *m.Mount, f: f}
			h.mu.Unlock()
			h.log.Info("holding", "mount", m.Mount.String())
			werr = writeFD(c, fdMessage{Op: opOK}, nil)
		case opDrop:
			h.mu.Lock()
			if old, ok := h.held[m.Key]; ok {
				old.f.Close()
				delete(h.held, m.Key)
				h.log.Info("dropped", "mount", m.Key)
			}
			h.mu.Unlock()
			werr = writeFD(c, fdMessage{Op: opOK}, nil)
		case opList:
			h.mu.Lock()
			all := make([]*heldFD, 0, len(h.held))
			for _, e := range h.held {
				all = append(all, e)
			}
			h.mu.Unlock()
			for _, e := range all {
				m := e.m
				if werr = writeFD(c, fdMessage{Op: opMount, Mount: &m}, e.f); werr != nil {
					break
				}
			}
			if werr == nil {
				werr = writeFD(c, fdMessage{Op: opEnd}, nil)
			}
		default:
			if f != nil {
				f.Close()
			}
			werr = writeFD(c, fdMessage{Op: opError, Error: "unexpected " + m.Op}, nil)
		}
		if werr != nil {
			return
		}
	}
}
