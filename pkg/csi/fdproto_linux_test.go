package csi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair returns two connected unix stream sockets.
func pair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// openFDs counts this process's open descriptors.
// openOf counts the process's open descriptors whose /proc link is link
// (such as "pipe:[123]").
func openOf(t *testing.T, link string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == link {
			n++
		}
	}
	return n
}

func testMount() *heldMount {
	return &heldMount{Key: "r.example/a@sha256:" + strings.Repeat("a", 64), Ref: "r.example/a@sha256:" + strings.Repeat("a", 64),
		Mountpoint: "/var/lib/x/mounts/aaa", Init: make([]byte, 64), Auth: &credential{Username: "u", Password: "secret"}}
}

// sendRaw writes a frame of body with the given descriptors attached.
func sendRaw(t *testing.T, c *net.UnixConn, size uint32, body []byte, fds ...int) {
	t.Helper()
	buf := binary.BigEndian.AppendUint32(nil, size)
	buf = append(buf, body...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(buf, oob, nil); err != nil {
		t.Fatal(err)
	}
}

func TestFDProtoRoundTrip(t *testing.T) {
	a, b := pair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := writeFD(a, fdMessage{Op: opPut, Mount: testMount()}, w); err != nil {
		t.Fatal(err)
	}
	m, f, err := readFD(b)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if m.Op != opPut || m.V != fdProtoVersion || *m.Mount.Auth != *testMount().Auth || m.Mount.Mountpoint != testMount().Mountpoint {
		t.Errorf("got %+v", m)
	}
	// The descriptor received is the pipe's write end.
	if _, err := f.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	if _, err := r.Read(one); err != nil || one[0] != 'x' {
		t.Errorf("read through the passed descriptor: %q %v", one, err)
	}
	if s := testMount().String(); strings.Contains(s, "secret") {
		t.Errorf("a mount's name shows its credential: %s", s)
	}
}

// TestFDProtoRefuses: oversized, malformed, wrongly versioned messages and
// messages with the wrong descriptors are refused, and every descriptor
// that came with them is closed.
func TestFDProtoRefuses(t *testing.T) {
	good := `{"v":1,"op":"put","mount":{"key":"k","ref":"r.example/a@sha256:` + strings.Repeat("a", 64) + `","mountpoint":"/m","init":"AAAAAAAAAAA="}}`
	cases := []struct {
		name string
		size uint32
		body string
		fds  int
		want string
	}{
		{"too long", maxFDMessage + 1, "", 1, "at most"},
		{"empty", 0, "", 1, "0 bytes"},
		{"not json", 5, "{nope", 1, "fd protocol"},
		{"other version", 0, `{"v":2,"op":"hello"}`, 1, "version 2"},
		{"unknown op", 0, `{"v":1,"op":"explode"}`, 1, "unknown operation"},
		{"hello with a descriptor", 0, `{"v":1,"op":"hello"}`, 1, "with a descriptor"},
		{"put with none", 0, good, 0, "no descriptor"},
		{"put with two", 0, good, 2, "2 descriptors"},
		{"put relative mountpoint", 0, strings.Replace(good, `"/m"`, `"m/../x"`, 1), 1, "incomplete mount"},
		{"put of an unpinned ref", 0, strings.Replace(good, "@sha256:"+strings.Repeat("a", 64), ":latest", 1), 1, "incomplete mount"},
		{"drop with no key", 0, `{"v":1,"op":"drop"}`, 0, "no key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := pair(t)
			var fds []int
			var pipes []string
			for range c.fds {
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				defer w.Close()
				fds = append(fds, int(w.Fd()))
				link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", w.Fd()))
				if err != nil {
					t.Fatal(err)
				}
				pipes = append(pipes, link)
			}
			size := c.size
			if size == 0 && c.body != "" {
				size = uint32(len(c.body))
			}
			sendRaw(t, a, size, []byte(c.body), fds...)
			_, f, err := readFD(b)
			if f != nil {
				f.Close()
				t.Fatal("a descriptor was returned with a refusal")
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
			if c.name != "empty" && c.name != "too long" && !errors.Is(err, errFDProto) {
				t.Errorf("%v does not wrap errFDProto", err)
			}
			// Each pipe has its two ends open here and nothing else: a
			// descriptor received and kept would be a third. (Counting all
			// the process's descriptors is not: others open and close
			// meanwhile.)
			for _, p := range pipes {
				if n := openOf(t, p); n != 2 {
					t.Errorf("%d descriptors of %s open after the refusal, want its 2 ends: a received one leaks", n, p)
				}
			}
		})
	}
}

// TestFDProtoMessageTooLargeToSend: writeFD refuses a message over the
// bound instead of sending it.
func TestFDProtoMessageTooLargeToSend(t *testing.T) {
	a, _ := pair(t)
	m := testMount()
	m.Init = make([]byte, maxFDMessage)
	if err := writeFD(a, fdMessage{Op: opPut, Mount: m}, nil); err == nil || !errors.Is(err, errFDProto) {
		t.Fatalf("writeFD of an oversized message: %v", err)
	}
}

// TestFDHolderKeepsListsAndDrops runs the holder: a mounter puts two mounts
// (the second replaced), lists them with their descriptors, drops one; the
// socket is 0600; a message before hello is refused.
func TestFDHolderKeepsListsAndDrops(t *testing.T) {
	dir, err := os.MkdirTemp("", "fdh-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "h.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ServeFDHolder(ctx, FDHolderOptions{Socket: sock, MountsDir: "/var/lib/x/mounts", DetachAfter: 100 * time.Millisecond})
	}()
	var c *net.UnixConn
	for i := 0; ; i++ {
		if c, err = dialFD(sock); err == nil {
			break
		}
		if i > 100 {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer c.Close()
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("holder socket: %v %v, want 0600", fi.Mode(), err)
	}
	// Before hello: refused.
	bad, _ := dialFD(sock)
	if err := call(bad, fdMessage{Op: opList}, nil); err == nil {
		t.Error("list before hello answered")
	}
	bad.Close()

	if err := call(c, fdMessage{Op: opHello}, nil); err != nil {
		t.Fatal(err)
	}
	// Descriptors of /dev/fuse (the holder refuses others); the one that
	// replaces another is told apart by its O_APPEND.
	fuse := func(flags int) *os.File {
		needRootFUSE(t)
		fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC|flags, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "/dev/fuse")
		t.Cleanup(func() { f.Close() })
		return f
	}
	m1, m2 := testMount(), testMount()
	m2.Ref = "r.example/b@sha256:" + strings.Repeat("b", 64)
	m2.Key, m2.Mountpoint = keyOfPinned(m2.Ref), "/var/lib/x/mounts/bbb"
	w1, w2, w3 := fuse(0), fuse(0), fuse(unix.O_APPEND)
	for _, p := range []struct {
		m *heldMount
		f *os.File
	}{{m1, w1}, {m2, w2}, {m2, w3}} {
		if err := call(c, fdMessage{Op: opPut, Mount: p.m}, p.f); err != nil {
			t.Fatal(err)
		}
	}
	list := func() map[string]*os.File {
		if err := writeFD(c, fdMessage{Op: opList}, nil); err != nil {
			t.Fatal(err)
		}
		out := map[string]*os.File{}
		for {
			m, f, err := readFD(c)
			if err != nil {
				t.Fatal(err)
			}
			if m.Op == opEnd {
				return out
			}
			out[m.Mount.Key] = f
			t.Cleanup(func() { f.Close() })
		}
	}
	got := list()
	if len(got) != 2 {
		t.Fatalf("listed %d mounts, want 2", len(got))
	}
	// The second put of m2 replaced the first: its descriptor is w3's.
	for key, wantAppend := range map[string]bool{m1.Key: false, m2.Key: true} {
		fl, err := unix.FcntlInt(got[key].Fd(), unix.F_GETFL, 0)
		if err != nil {
			t.Fatal(err)
		}
		if (fl&unix.O_APPEND != 0) != wantAppend {
			t.Errorf("mount %s: the descriptor listed is not the last one put (flags %#x)", key, fl)
		}
	}
	if err := call(c, fdMessage{Op: opDrop, Key: m2.Key}, nil); err != nil {
		t.Fatal(err)
	}
	if got := list(); len(got) != 1 || got[m1.Key] == nil {
		t.Errorf("after drop: %v", got)
	}
	c.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the holder did not stop")
	}
}
