package csi

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"

	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// takeOver serves the mounts a predecessor still running hands over (at
// opt.Handoff) and those the fd holder keeps that no one handed over (a
// predecessor that crashed). It returns the mountpoints it serves.
func (m *Mounter) takeOver(ctx context.Context) map[string]bool {
	taken := map[string]bool{}
	if m.opt.Handoff != "" {
		if c, err := dialFD(m.opt.Handoff); err == nil {
			start := time.Now()
			got := m.receive(c, opTake)
			c.Close()
			n := m.resumeAll(ctx, got, taken)
			m.log.Info("took over from the predecessor", "mounts", n, "seconds", time.Since(start).Seconds())
		}
	}
	if m.holder != nil {
		start := time.Now()
		var got []received
		err := m.holder.do(func(c *net.UnixConn) error {
			got = m.receive(c, opList)
			return nil
		})
		if err != nil {
			m.log.Warn("fd holder not reached", "socket", m.opt.FDHolder, "error", err.Error())
		} else if n := m.resumeAll(ctx, got, taken); n > 0 {
			m.log.Info("took over from the fd holder", "mounts", n, "seconds", time.Since(start).Seconds())
		}
	}
	return taken
}

// received is a mount and its master descriptor as received.
type received struct {
	h heldMount
	f *os.File
}

// receive sends op (take or list) on c and returns the mounts answered.
func (m *Mounter) receive(c *net.UnixConn, op string) []received {
	if op == opTake {
		if err := checkPeer(c); err != nil {
			m.log.Warn("predecessor refused", "error", err.Error())
			return nil
		}
		if err := call(c, fdMessage{Op: opHello}, nil); err != nil {
			m.log.Warn("predecessor handoff", "error", err.Error())
			return nil
		}
	}
	if err := writeFD(c, fdMessage{Op: op}, nil); err != nil {
		m.log.Warn("handoff", "op", op, "error", err.Error())
		return nil
	}
	var out []received
	for {
		msg, f, err := readFD(c)
		if err != nil {
			m.log.Warn("handoff", "op", op, "error", err.Error())
			return out
		}
		if msg.Op == opEnd {
			break
		}
		if msg.Op != opMount {
			if f != nil {
				f.Close()
			}
			m.log.Warn("handoff: unexpected message", "op", msg.Op, "error", msg.Error)
			return out
		}
		if err := errors.Join(checkHeldMount(*msg.Mount, m.opt.MountsDir), checkFUSE(f)); err != nil {
			// Not one of this mounter's mounts (a forged or corrupt
			// entry): neither served nor detached.
			f.Close()
			m.log.Warn("handoff: a mount refused, left as it is", "op", op, "mount", msg.Mount.String(), "error", err.Error())
			continue
		}
		out = append(out, received{*msg.Mount, f})
	}
	if op == opTake {
		writeFD(c, fdMessage{Op: opOK}, nil)
	}
	return out
}

// resumeAll serves, in parallel, each mount received that taken does not
// hold yet; it returns how many it took.
func (m *Mounter) resumeAll(ctx context.Context, got []received, taken map[string]bool) int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for _, r := range got {
		if taken[r.h.Mountpoint] {
			r.f.Close() // a copy of a connection served already
			continue
		}
		taken[r.h.Mountpoint] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := m.resume(ctx, r.h, r.f)
			if err == nil {
				mu.Lock()
				n++
				mu.Unlock()
				return
			}
			if !retryResume(err) {
				m.giveUp(r, err)
				return
			}
			// The registry or the cache may be back soon: retry in the
			// background, the kernel queueing the mount's requests
			// meanwhile; a Mount of it waits as for a mount in progress.
			m.log.Warn("a mount handed over cannot be served yet: retrying", "mount", r.h.String(), "for", resumeRetryFor.String(), "error", err.Error())
			done := make(chan struct{})
			m.mu.Lock()
			m.inflight[r.h.Key] = done
			m.mu.Unlock()
			go m.resumeLater(ctx, r, done)
		}()
	}
	wg.Wait()
	return n
}

// How long and how often a mount handed over whose version cannot be
// opened (registry and cache unreachable) is tried again before it is
// detached: the first retry after resumeRetryFirst, each next one after
// twice the wait before, at most resumeRetryMax.
var (
	resumeRetryFor   = time.Minute
	resumeRetryFirst = 250 * time.Millisecond
	resumeRetryMax   = 10 * time.Second
)

// retryResume tells whether a failure to serve a mount handed over may
// pass: not a version that is not there, not a volume, or not readable
// with the mount's credential.
func retryResume(err error) bool {
	switch kindOf(err) {
	case kindInvalid, kindNotFound, kindPermission:
		return false
	}
	return true
}

// resumeLater tries to serve r again, with backoff, for up to
// resumeRetryFor, then gives up on it; done is r's entry in m.inflight,
// removed and closed when it returns.
func (m *Mounter) resumeLater(ctx context.Context, r received, done chan struct{}) {
	defer func() {
		m.mu.Lock()
		delete(m.inflight, r.h.Key)
		close(done)
		m.mu.Unlock()
	}()
	start := time.Now()
	deadline := start.Add(resumeRetryFor)
	wait := resumeRetryFirst
	var err error
	for attempt := 2; ; attempt++ {
		if time.Now().Add(wait).After(deadline) {
			wait = time.Until(deadline)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			m.giveUp(r, ctx.Err())
			return
		}
		m.mu.Lock()
		away := m.gaveAway
		m.mu.Unlock()
		if away {
			// Handed over to a successor meanwhile, which did not get this
			// one (the fd holder, if any, still keeps it): let go of it.
			m.log.Warn("a mount never served was not handed over", "mount", r.h.String())
			r.f.Close()
			return
		}
		if err = m.resume(ctx, r.h, r.f); err == nil {
			m.log.Info("a mount handed over is served after retrying", "mount", r.h.String(), "attempts", attempt, "seconds", time.Since(start).Seconds())
			return
		}
		if !retryResume(err) || !time.Now().Before(deadline) {
			break
		}
		wait = min(2*wait, resumeRetryMax)
	}
	m.giveUp(r, err)
}

// giveUp detaches a mount handed over that cannot be served: its readers
// see ENOTCONN.
func (m *Mounter) giveUp(r received, err error) {
	m.log.Warn("a mount handed over could not be served: detaching it", "mount", r.h.String(), "error", err.Error())
	r.f.Close()
	mounts.Detach(r.h.Mountpoint)
	m.dropHolder(r.h.Key)
}

// resume serves the mount h, whose master descriptor is f.
func (m *Mounter) resume(ctx context.Context, h heldMount, f *os.File) error {
	ref, err := oci.ParseRef(h.Ref)
	if err != nil {
		return err
	}
	prefetch, _ := mounts.Prefetcher(h.Prefetch)
	vol, pinned, err := m.open(ctx, ref, h.Auth, h.IndexKeys)
	if err != nil {
		return err
	}
	conn, err := lazy.ResumeConn(f, h.Init, h.Mountpoint, vol, lazy.ConnOptions{AllowOther: true})
	if err != nil {
		vol.Close()
		return err
	}
	if _, ok := m.add(ref, h, vol, pinned, conn, prefetch); !ok {
		conn.Drain()
		vol.Close()
		return errors.New("this mounter handed its mounts over already")
	}
	m.log.Info("serving a mount taken over", "ref", pinned, "path", h.Mountpoint)
	return nil
}

// ServeHandoff answers successors on l until ctx ends: the first that asks
// gets every mount, and this mounter serves none from then on.
func (m *Mounter) ServeHandoff(ctx context.Context, l *net.UnixListener) {
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			if err := checkPeer(c); err != nil {
				m.log.Warn("handoff refused", "error", err.Error())
				return
			}
			for {
				msg, f, err := readFD(c)
				if f != nil {
					f.Close()
				}
				if err != nil {
					return
				}
				switch msg.Op {
				case opHello:
					if writeFD(c, fdMessage{Op: opOK}, nil) != nil {
						return
					}
				case opTake:
					m.handOver(c)
					return
				default:
					writeFD(c, fdMessage{Op: opError, Error: "unexpected " + msg.Op}, nil)
					return
				}
			}
		}()
	}
}

// handoffMountWait bounds how long a handoff waits for the mounts in
// progress when it starts (a mount opening its version) to finish, so that
// it hands them over too.
var handoffMountWait = 30 * time.Second

// handOver refuses new mounts, waits (up to handoffMountWait) for the
// mounts in progress, then drains every mount and sends it on c. A mount
// that cannot be sent is served here again; one still in progress after
// the wait fails (see add), and its request is retried on the successor.
func (m *Mounter) handOver(c *net.UnixConn) {
	start := time.Now()
	m.mu.Lock()
	m.handedOver = true
	m.mu.Unlock()
	if n := m.waitInflight(handoffMountWait); n > 0 {
		m.log.Warn("handoff: mounts still in progress are not handed over", "mounts", n, "waited", handoffMountWait.String())
	}
	m.mu.Lock()
	m.gaveAway = true
	all := m.served
	m.served = map[string]*mounted{}
	m.mu.Unlock()
	var failed error
	sent := 0
	for key, s := range all {
		s.stop()
		s.conn.Drain()
		if failed == nil {
			h := s.held
			failed = writeFD(c, fdMessage{Op: opMount, Mount: &h}, s.conn.Master())
		}
		if failed != nil {
			// Serve it again: nobody else does.
			conn, err := lazy.ResumeConn(s.conn.Master(), s.held.Init, s.held.Mountpoint, s.vol, lazy.ConnOptions{AllowOther: true})
			if err != nil {
				m.log.Warn("a mount not handed over could not be served again", "mount", key, "error", err.Error())
				continue
			}
			s.conn = conn
			m.mu.Lock()
			m.served[key] = s
			m.mu.Unlock()
			continue
		}
		s.conn.Master().Close()
		s.vol.Close()
		s.lease()
		sent++
	}
	if failed == nil {
		failed = writeFD(c, fdMessage{Op: opEnd}, nil)
	}
	if failed == nil {
		msg, f, err := readFD(c)
		if f != nil {
			f.Close()
		}
		if err == nil && msg.Op != opOK {
			err = errors.New(msg.Op + " " + msg.Error)
		}
		failed = err
	}
	if failed != nil {
		m.log.Warn("handoff to a successor", "sent", sent, "error", failed.Error())
	}
	m.log.Info("handed the mounts over to a successor", "mounts", sent, "seconds", time.Since(start).Seconds())
}

// waitInflight waits up to limit for the mounts in progress to finish and
// returns how many still are.
func (m *Mounter) waitInflight(limit time.Duration) int {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		m.mu.Lock()
		var wait chan struct{}
		for _, ch := range m.inflight {
			wait = ch
			break
		}
		n := len(m.inflight)
		m.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-wait:
		case <-deadline.C:
			return n
		}
	}
}

// holderClient is the mounter's connection to the fd holder; it
// reconnects on the next call after an error.
type holderClient struct {
	path string
	mu   sync.Mutex
	c    *net.UnixConn
	gen  int // connections made: a new one must be given every mount again
}

// do runs f on a connection to the holder, connecting first if needed;
// the connection is dropped when f fails.
func (h *holderClient) do(f func(c *net.UnixConn) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c == nil {
		c, err := dialFD(h.path)
		if err != nil {
			return err
		}
		if err := checkPeer(c); err != nil {
			c.Close()
			return err
		}
		if err := call(c, fdMessage{Op: opHello}, nil); err != nil {
			c.Close()
			return err
		}
		h.c = c
		h.gen++
	}
	if err := f(h.c); err != nil {
		h.c.Close()
		h.c = nil
		return err
	}
	return nil
}

// ping checks the holder is there.
func (h *holderClient) ping() error {
	return h.do(func(c *net.UnixConn) error { return call(c, fdMessage{Op: opHello}, nil) })
}

// generation returns how many connections were made.
func (h *holderClient) generation() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gen
}

// putHolder gives s's descriptor to the fd holder, if there is one.
func (m *Mounter) putHolder(s *mounted) {
	if m.holder == nil {
		return
	}
	h := s.held
	err := m.holder.do(func(c *net.UnixConn) error { return call(c, fdMessage{Op: opPut, Mount: &h}, s.conn.Master()) })
	m.mu.Lock()
	s.inHolder = err == nil
	m.mu.Unlock()
	if err != nil {
		m.log.Warn("fd holder: mount not held", "mount", h.String(), "error", err.Error())
	}
}

// dropHolder tells the fd holder to forget mount key.
func (m *Mounter) dropHolder(key string) {
	if m.holder == nil {
		return
	}
	if err := m.holder.do(func(c *net.UnixConn) error { return call(c, fdMessage{Op: opDrop, Key: key}, nil) }); err != nil {
		m.log.Warn("fd holder: mount not dropped", "mount", key, "error", err.Error())
	}
}

// KeepHolder checks the fd holder every interval until ctx ends, and gives
// a holder that restarted every mount again.
func (m *Mounter) KeepHolder(ctx context.Context, interval time.Duration) {
	if m.holder == nil {
		return
	}
	seen := m.holder.generation()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.holder.ping(); err != nil {
			continue
		}
		if g := m.holder.generation(); g != seen {
			seen = g
			m.mu.Lock()
			all := make([]*mounted, 0, len(m.served))
			for _, s := range m.served {
				all = append(all, s)
			}
			m.mu.Unlock()
			for _, s := range all {
				m.putHolder(s)
			}
			m.log.Info("fd holder reconnected: mounts given again", "mounts", len(all))
		}
	}
}
