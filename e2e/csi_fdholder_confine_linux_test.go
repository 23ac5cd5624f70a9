package e2e

import (
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A peer of the fd protocol (see pkg/csi/fdproto.go), played by the test
// as root: a forged holder entry, or a forged put to the real holder.

// fdMsg is a message of the fd protocol.
type fdMsg struct {
	V     int    `json:"v"`
	Op    string `json:"op"`
	Mount *fdEnt `json:"mount,omitempty"`
	Error string `json:"error,omitempty"`
}

// fdEnt is a mount as the fd protocol carries it.
type fdEnt struct {
	Key        string `json:"key"`
	Ref        string `json:"ref"`
	Mountpoint string `json:"mountpoint"`
	Init       []byte `json:"init"`
}

// forgedEntry is a mount entry for ref at mp, well formed.
func forgedEntry(ref, mp string) *fdEnt {
	return &fdEnt{Key: ref, Ref: ref, Mountpoint: mp, Init: make([]byte, 64)}
}

func fdSend(c *net.UnixConn, m fdMsg, f *os.File) error {
	m.V = 1
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	buf := append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	_, _, err = c.WriteMsgUnix(buf, oob, nil)
	return err
}

func fdRecv(c *net.UnixConn) (fdMsg, error) {
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var hdr [4]byte
	if _, err := ioReadFull(c, hdr[:]); err != nil {
		return fdMsg{}, err
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := ioReadFull(c, body); err != nil {
		return fdMsg{}, err
	}
	var m fdMsg
	return m, json.Unmarshal(body, &m)
}

func ioReadFull(c *net.UnixConn, b []byte) (int, error) {
	for got := 0; got < len(b); {
		n, err := c.Read(b[got:])
		if err != nil {
			return got, err
		}
		got += n
	}
	return len(b), nil
}

// markedTmpfs mounts a tmpfs at dir (made) holding a marker file: a mount
// that must survive the test's forged entries. Cleanup detaches it.
func markedTmpfs(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// stillMounted fails the test when the tmpfs at dir is gone.
func stillMounted(t *testing.T, dir, what string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, "marker")); err != nil || string(b) != "still here" {
		t.Errorf("%s: the mount at %s was detached (marker: %q %v)", what, dir, b, err)
	}
}

// TestCSIFDHolderEntriesConfined: entries of the fd protocol whose
// mountpoint is outside the mounter's mounts directory, or whose
// descriptor is not /dev/fuse, are refused by the real fd holder (a root
// peer's put) and by the real mounter (a forged holder's list), and the
// paths they name stay mounted. Each entry names a version its registry
// does not have: a mounter that accepted it would fail to serve it and
// detach its path at once.
func TestCSIFDHolderEntriesConfined(t *testing.T) {
	reg := newDistribution(t)
	missing := reg.Host + "/vols/forged@sha256:" + strings.Repeat("0", 64)
	pipe := func() *os.File {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); w.Close() })
		return w
	}
	fuseFD := func() *os.File {
		f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}

	t.Run("put to the real holder", func(t *testing.T) {
		n := startCSI(t, time.Minute)
		outside := filepath.Join(n.root, "outside")
		markedTmpfs(t, outside)
		h := n.startHolder("--detach-after", "1s")
		var c net.Conn
		var err error
		for i := 0; ; i++ { // the socket is bound a moment before it listens
			if c, err = net.Dial("unix", h.socket); err == nil {
				break
			}
			if i > 100 {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		defer c.Close()
		uc := c.(*net.UnixConn)
		if err := fdSend(uc, fdMsg{Op: "hello"}, nil); err != nil {
			t.Fatal(err)
		}
		if m, err := fdRecv(uc); err != nil || m.Op != "ok" {
			t.Fatalf("hello: %+v %v", m, err)
		}
		if err := fdSend(uc, fdMsg{Op: "put", Mount: forgedEntry(missing, outside)}, pipe()); err != nil {
			t.Fatal(err)
		}
		m, err := fdRecv(uc)
		if err != nil {
			t.Fatal(err)
		}
		if m.Op != "error" {
			t.Errorf("the holder answered %q to a put of %s with a pipe, want error", m.Op, outside)
		}
		t.Logf("the holder's answer: %s %s", m.Op, m.Error)
		c.Close()

		// A mounter that takes the holder's mounts over, then the holder
		// stopped with no mounter: neither detaches the path.
		stopProcess(t, n.mounter, 30*time.Second)
		n.mounterFlags = []string{"--fd-holder", h.socket}
		n.startMounter()
		stillMounted(t, outside, "a mounter started with the holder")
		n.kill9Mounter()
		stopProcess(t, h.cmd, 15*time.Second)
		stillMounted(t, outside, "the holder stopped with no mounter")
	})

	t.Run("list from a forged holder", func(t *testing.T) {
		dir, err := os.MkdirTemp("", "bdnvol-forged-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		outside := filepath.Join(dir, "outside")
		markedTmpfs(t, outside)
		sock := filepath.Join(dir, "h.sock")
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		// The forged holder answers every list with: a path outside the
		// mounts directory with a real /dev/fuse descriptor, and a path
		// outside with a pipe. startCSIWith makes the mounts directory;
		// an entry inside it with a pipe is added once it is known.
		var inside string
		insideReady := make(chan struct{})
		fuse, pipe1, pipe2 := fuseFD(), pipe(), pipe()
		listed := make(chan struct{}, 4)
		go func() {
			for {
				c, err := l.AcceptUnix()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					for {
						m, err := fdRecv(c)
						if err != nil {
							return
						}
						switch m.Op {
						case "list":
							<-insideReady
							fdSend(c, fdMsg{Op: "mount", Mount: forgedEntry(missing, outside)}, fuse)
							fdSend(c, fdMsg{Op: "mount", Mount: forgedEntry(missing, filepath.Join(outside, "sub"))}, pipe1)
							fdSend(c, fdMsg{Op: "mount", Mount: forgedEntry(missing, inside)}, pipe2)
							fdSend(c, fdMsg{Op: "end"}, nil)
							listed <- struct{}{}
						default:
							fdSend(c, fdMsg{Op: "ok"}, nil)
						}
					}
				}()
			}
		}()
		n := startCSIWith(t, time.Minute, "1GiB", nil)
		inside = filepath.Join(n.mountsDir, "forged")
		markedTmpfs(t, inside)
		close(insideReady)
		stopProcess(t, n.mounter, 30*time.Second)
		n.mounterFlags = []string{"--fd-holder", sock}
		n.startMounter()
		select {
		case <-listed:
		case <-time.After(30 * time.Second):
			t.Fatal("the mounter never listed the forged holder's mounts")
		}
		if !n.mounterLog.waitFor(10*time.Second, `"msg":"serving"`) {
			t.Fatalf("the mounter does not serve:\n%s", n.mounterLog)
		}
		stillMounted(t, outside, "a mounter given a forged entry outside its mounts directory")
		stillMounted(t, inside, "a mounter given a forged entry with a pipe")
		if got := strings.Count(n.mounterLog.String(), "a mount refused"); got != 3 {
			t.Errorf("the mounter refused %d forged entries, want 3:\n%s", got, n.mounterLog)
		}
		if strings.Contains(n.mounterLog.String(), "detaching it") {
			t.Errorf("the mounter tried to detach a forged entry:\n%s", n.mounterLog)
		}
	})
}
