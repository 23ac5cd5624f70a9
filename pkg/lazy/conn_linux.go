package lazy

import (
	"bufio"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// fuseDevIocClone is FUSE_DEV_IOC_CLONE, _IOR(229, 0, uint32): it binds a
// freshly opened /dev/fuse to the connection of another descriptor.
const fuseDevIocClone = 0x8004e500

// opInit is the FUSE_INIT opcode.
const opInit = 26

// connMaxWrite is the largest request the kernel is allowed to send.
const connMaxWrite = 1 << 20

// connBuf is the size of a request or reply buffer: the largest request
// and its headers.
const connBuf = connMaxWrite + 64<<10

// connReaders is how many requests a Conn serves at once.
const connReaders = 6

// ConnOptions configure MountConn and ResumeConn. Zero values select
// defaults.
type ConnOptions struct {
	AllowOther bool   // let other users read the mount
	UID, GID   uint32 // owner of every entry; 0 means root
	Logger     *log.Logger
}

// Conn is a FUSE mount served by this process in a way that can change
// hands: its master descriptor is kept idle (and can be passed to another
// process, see Master and ResumeConn), requests are read from a clone of
// it, and no request depends on state of the process that answered the
// ones before (see handoffFS). A clone's requests that were read but never
// answered fail with ECONNABORTED when the clone is closed, so a process
// that dies leaves no reader hanging as long as another holds the master.
// Passthrough is not used: every read is served through FUSE.
type Conn struct {
	Mountpoint string
	master     *os.File
	clone      *os.File
	init       []byte
	id         string // fusectl's connection name, "" if unknown
	ps         *fuse.ProtocolServer
	log        *log.Logger

	stopFd   int
	readers  sync.WaitGroup
	gone     chan struct{} // closed once the kernel ended the connection
	goneOnce sync.Once
	drained  sync.Once
}

func (o ConnOptions) protocol(v *Volume) *fuse.ProtocolServer {
	logger := o.Logger
	if logger == nil {
		logger = log.New(discard{}, "", 0)
	}
	return fuse.NewProtocolServer(newHandoffFS(v, o.UID, o.GID), &fuse.MountOptions{
		MaxWrite: connMaxWrite, MaxReadAhead: connMaxWrite, DisableReadDirPlus: true,
		FsName: FsNamePrefix + v.Root().Digest.String(), Name: FsType, Logger: logger,
		DisabledCapabilities: fuse.CAP_PASSTHROUGH,
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// MountConn mounts v read-only at dir (with mount(2): it needs root) and
// serves it until it is unmounted or drained.
func MountConn(dir string, v *Volume, opt ConnOptions) (*Conn, error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	master := os.NewFile(uintptr(fd), "/dev/fuse")
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=%d,group_id=%d,default_permissions,max_read=%d", fd, os.Getuid(), os.Getgid(), connMaxWrite)
	if opt.AllowOther {
		data += ",allow_other"
	}
	if err := unix.Mount(FsNamePrefix+v.Root().Digest.String(), dir, "fuse."+FsType, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		master.Close()
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	ps := opt.protocol(v)
	// The kernel's first request is INIT: answer it on the master and keep
	// it, for a successor to prime its own protocol server with.
	buf := make([]byte, connBuf)
	n, err := readRetry(fd, buf)
	if err == nil && n < 40 {
		err = errors.New("short INIT")
	}
	if err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		master.Close()
		return nil, fmt.Errorf("mount %s: reading INIT: %w", dir, err)
	}
	out := make([]byte, connBuf)
	w, st := ps.HandleRequest([][]byte{buf[:n]}, [][]byte{out})
	if !st.Ok() || w == 0 {
		unix.Unmount(dir, unix.MNT_DETACH)
		master.Close()
		return nil, fmt.Errorf("mount %s: INIT: %v", dir, st)
	}
	if _, err := unix.Write(fd, out[:w]); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		master.Close()
		return nil, fmt.Errorf("mount %s: INIT reply: %w", dir, err)
	}
	c, err := serveConn(dir, master, append([]byte(nil), buf[40:n]...), ps, opt)
	if err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		master.Close()
		return nil, err
	}
	askNoPoll(dir)
	return c, nil
}

// askNoPoll has the kernel ask the server of the mount at dir for POLL
// once, which the protocol server answers ENOSYS: the kernel then sends no
// more for the connection, whoever serves it later. Otherwise every file
// the Go runtime opens on the mount asks POLL from inside epoll_ctl, where
// a garbage collection cannot stop it: a process that serves the mount and
// also opens files on it (the tests, a warm-up) deadlocks when a GC starts
// while the POLL waits on the stopped readers.
func askNoPoll(dir string) {
	fd, err := unix.Open(filepath.Join(dir, pollProbeName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
	unix.Close(fd)
}

// pollProbeName is the file name go-fuse's protocol server answers on its
// own (a file whose POLL is answered ENOSYS), outside any volume's tree.
const pollProbeName = ".go-fuse-epoll-hack"

// ResumeConn serves v on a mount at dir that another process mounted and
// served: master is the mount's master descriptor (see Conn.Master) and
// init the kernel's INIT request body it answered (Conn.Init). The kernel
// requests queued meanwhile are served now. The Conn owns master.
func ResumeConn(master *os.File, init []byte, dir string, v *Volume, opt ConnOptions) (*Conn, error) {
	ps := opt.protocol(v)
	// Prime the protocol server with the kernel's settings: a made-up INIT
	// whose reply goes nowhere (the kernel has its answer).
	hdr := fuse.InHeader{Length: uint32(40 + len(init)), Opcode: opInit, Unique: 1}
	req := append(append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&hdr)), 40)...), init...)
	out := make([]byte, 4096)
	if _, st := ps.HandleRequest([][]byte{req}, [][]byte{out}); !st.Ok() {
		return nil, fmt.Errorf("resume %s: INIT: %v", dir, st)
	}
	return serveConn(dir, master, init, ps, opt)
}

// serveConn clones master and starts the readers.
func serveConn(dir string, master *os.File, init []byte, ps *fuse.ProtocolServer, opt ConnOptions) (*Conn, error) {
	cfd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("serve %s: %w", dir, err)
	}
	m := uint32(master.Fd())
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(cfd), fuseDevIocClone, uintptr(unsafe.Pointer(&m))); e != 0 {
		unix.Close(cfd)
		return nil, fmt.Errorf("serve %s: cloning the FUSE descriptor: %w", dir, e)
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(cfd)
		return nil, fmt.Errorf("serve %s: %w", dir, err)
	}
	c := &Conn{Mountpoint: dir, master: master, clone: os.NewFile(uintptr(cfd), "/dev/fuse"), init: init,
		id: connOf(dir), ps: ps, stopFd: stop, gone: make(chan struct{}), log: opt.Logger}
	for range connReaders {
		c.readers.Add(1)
		go c.serve(cfd)
	}
	return c, nil
}

// readRetry reads one request from a blocking descriptor.
func readRetry(fd int, buf []byte) (int, error) {
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		return n, err
	}
}

// serve reads and answers requests on fd, c's clone, until the connection
// ends or Drain asks it to stop: each request read is answered first. It
// takes the descriptor number rather than reading c.clone, which Drain
// closes once every reader has returned.
func (c *Conn) serve(fd int) {
	defer c.readers.Done()
	in := make([]byte, connBuf)
	out := make([]byte, connBuf)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(c.stopFd), Events: unix.POLLIN}}
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		n, err := unix.Read(fd, in)
		switch err {
		case nil:
		case unix.EAGAIN, unix.EINTR, unix.ENOENT:
			continue
		case unix.ENODEV:
			c.goneOnce.Do(func() { close(c.gone) })
			return
		default:
			if c.log != nil {
				c.log.Printf("%s: reading FUSE requests: %v", c.Mountpoint, err)
			}
			c.goneOnce.Do(func() { close(c.gone) })
			return
		}
		w, st := c.ps.HandleRequest([][]byte{in[:n]}, [][]byte{out})
		if !st.Ok() || w == 0 {
			continue // no reply (FORGET) or a request that cannot be parsed
		}
		// ENOENT: the kernel no longer waits for this one (interrupted).
		unix.Write(fd, out[:w])
	}
}

// Master returns the mount's master descriptor, to pass to another
// process (which then serves it with ResumeConn). It stays owned by c.
func (c *Conn) Master() *os.File { return c.master }

// Init returns the body of the kernel's INIT request of the mount.
func (c *Conn) Init() []byte { return c.init }

// Done is closed once the kernel ended the connection (the mount is gone
// or aborted).
func (c *Conn) Done() <-chan struct{} { return c.gone }

// Drain stops reading requests and returns once every request read has
// been answered; the kernel queues the next ones for whoever serves the
// master next. The mount stays.
func (c *Conn) Drain() {
	c.drained.Do(func() {
		var one = [8]byte{1}
		unix.Write(c.stopFd, one[:])
		c.readers.Wait()
		c.clone.Close()
		unix.Close(c.stopFd)
	})
}

// Close drains c and closes the master: with no other process holding it,
// the kernel ends the connection (readers see ENOTCONN).
func (c *Conn) Close() error {
	c.Drain()
	return c.master.Close()
}

// Unmount unmounts c, detaching it lazily when it stays busy for busy;
// when other mounts of the connection (bind mounts) keep it after that,
// the connection is aborted. Then c is closed.
func (c *Conn) Unmount(busy time.Duration) error {
	giveUp := time.Now().Add(busy)
	for {
		err := unix.Unmount(c.Mountpoint, 0)
		if err == nil || err == unix.EINVAL || err == unix.ENOENT {
			break
		}
		if time.Now().After(giveUp) {
			if err := unix.Unmount(c.Mountpoint, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
				c.Close()
				return fmt.Errorf("unmount %s: %w", c.Mountpoint, err)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-c.gone:
	case <-time.After(busy):
		if c.id != "" {
			os.WriteFile("/sys/fs/fuse/connections/"+c.id+"/abort", []byte("1"), 0)
		}
	}
	return c.Close()
}

// connOf returns fusectl's name of the connection mounted at dir (its
// device minor number) from /proc/self/mountinfo, without touching the
// mount (a stat would wait for a server).
func connOf(dir string) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	id := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) > 4 && fl[4] == dir {
			if _, minor, ok := strings.Cut(fl[2], ":"); ok {
				id = minor // the last mount there is the one on top
			}
		}
	}
	return id
}
