package csi

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needRootFUSE skips (fails under CI=true) a test that mounts FUSE with
// mount(2).
func needRootFUSE(t *testing.T) {
	t.Helper()
	why := ""
	if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	} else if os.Geteuid() != 0 {
		why = "mounting FUSE with mount(2) needs root"
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("FUSE is unusable under CI=true: %s", why)
	}
	t.Skipf("FUSE is unusable: %s", why)
}

// mountedAt returns the device minor (fusectl's connection name) of the
// mount at dir in /proc/self/mountinfo, and whether there is one.
func mountedAt(t *testing.T, dir string) (string, bool) {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	id, ok := "", false
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) > 4 && fl[4] == dir {
			_, id, _ = strings.Cut(fl[2], ":")
			ok = true
		}
	}
	return id, ok
}

// fuseMount makes a real FUSE mount (mount(2) on /dev/fuse, as
// lazy.MountConn does) that nobody serves: the holder only keeps its
// descriptor and detaches it. It returns the mountpoint and the master
// descriptor. Whatever the test does, cleanup aborts the connection and
// detaches the mount, so that no dead mount is left behind.
func fuseMount(t *testing.T) (string, *os.File) {
	t.Helper()
	needRootFUSE(t)
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	master := os.NewFile(uintptr(fd), "/dev/fuse")
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	if err := unix.Mount("bdnvol:test", dir, "fuse.bdnvol", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		master.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The connection mounted at dir now (ours: dir is this test's); a
		// number read earlier may have been reused by another mount since.
		if id, ok := mountedAt(t, dir); ok && id != "" {
			os.WriteFile("/sys/fs/fuse/connections/"+id+"/abort", []byte("1"), 0)
		}
		unix.Unmount(dir, unix.MNT_DETACH)
		master.Close()
	})
	return dir, master
}

// startHolder runs ServeFDHolder on a new socket, holding mounts in
// mountsDir, and returns a stop that cancels it and waits for it to return,
// and how long that took.
func startHolder(t *testing.T, mountsDir string, detachAfter time.Duration) (sock string, stop func() time.Duration) {
	t.Helper()
	dir, err := os.MkdirTemp("", "fdh-") // short: a socket path is bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock = filepath.Join(dir, "h.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ServeFDHolder(ctx, FDHolderOptions{Socket: sock, MountsDir: mountsDir, DetachAfter: detachAfter})
	}()
	stopped := false
	stop = func() time.Duration {
		stopped = true
		start := time.Now()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(detachAfter + 10*time.Second):
			t.Fatal("the holder did not stop")
		}
		return time.Since(start)
	}
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})
	return sock, stop
}

// holderMounter connects to the holder at sock as a mounter and gives it
// the mount at mp with master.
func holderMounter(t *testing.T, sock, mp string, master *os.File) *net.UnixConn {
	t.Helper()
	var c *net.UnixConn
	var err error
	for i := 0; ; i++ {
		if c, err = dialFD(sock); err == nil {
			break
		}
		if i > 100 {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { c.Close() })
	if err := call(c, fdMessage{Op: opHello}, nil); err != nil {
		t.Fatal(err)
	}
	m := testMount()
	m.Mountpoint = mp
	if err := call(c, fdMessage{Op: opPut, Mount: m}, master); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFDHolderStopWithMounterThatStays: a holder stopped while a mounter
// is connected (a holder upgrade) waits DetachAfter to see it stay; it
// stays, so the mount it holds is kept (served by the mounter).
func TestFDHolderStopWithMounterThatStays(t *testing.T) {
	mp, master := fuseMount(t)
	detachAfter := 500 * time.Millisecond
	sock, stop := startHolder(t, filepath.Dir(mp), detachAfter)
	holderMounter(t, sock, mp, master)
	took := stop()
	t.Logf("MEASURE holder stop with a mounter that stays: %v (detach-after %v)", took.Round(time.Millisecond), detachAfter)
	if took < detachAfter {
		t.Errorf("the holder stopped after %v, before its %v wait to see the mounter stay", took, detachAfter)
	}
	if _, ok := mountedAt(t, mp); !ok {
		t.Fatal("the holder detached a mount whose mounter stays connected")
	}
}

// TestFDHolderStopWithMounterThatGoes: a holder stopped while a mounter is
// connected, and the mounter goes too (an uninstall): the holder detaches
// the mount, well within DetachAfter of the mounter going.
func TestFDHolderStopWithMounterThatGoes(t *testing.T) {
	mp, master := fuseMount(t)
	detachAfter := 5 * time.Second
	sock, stop := startHolder(t, filepath.Dir(mp), detachAfter)
	c := holderMounter(t, sock, mp, master)
	master.Close() // the mounter's own copy goes with it: the holder's is the last
	go func() {
		time.Sleep(200 * time.Millisecond)
		c.Close() // the mounter exits
	}()
	took := stop()
	t.Logf("MEASURE holder stop with a mounter that goes 200ms later: detached after %v (detach-after %v)", took.Round(time.Millisecond), detachAfter)
	if took >= detachAfter {
		t.Errorf("the holder took %v to stop, its whole %v: it did not see the mounter go", took, detachAfter)
	}
	if _, ok := mountedAt(t, mp); ok {
		t.Fatal("every mounter went and the holder stopped, but the mount is still there")
	}
}

// TestFDHolderStopWithNoMounter: a holder stopped with no mounter
// connected waits DetachAfter for one: if one comes the mount is kept,
// else it is detached.
func TestFDHolderStopWithNoMounter(t *testing.T) {
	for _, comes := range []bool{true, false} {
		t.Run(fmt.Sprintf("mounter comes %v", comes), func(t *testing.T) {
			mp, master := fuseMount(t)
			detachAfter := 2 * time.Second
			sock, stop := startHolder(t, filepath.Dir(mp), detachAfter)
			c := holderMounter(t, sock, mp, master)
			c.Close() // the mounter crashed: the holder keeps the mount
			time.Sleep(100 * time.Millisecond)
			if comes {
				go func() {
					time.Sleep(300 * time.Millisecond)
					c, err := dialFD(sock)
					if err != nil {
						return
					}
					t.Cleanup(func() { c.Close() })
					call(c, fdMessage{Op: opHello}, nil)
				}()
			}
			took := stop()
			_, ok := mountedAt(t, mp)
			if comes && (!ok || took >= detachAfter) {
				t.Errorf("a mounter came %v after the stop: mounted %v after %v, want kept before %v", 300*time.Millisecond, ok, took, detachAfter)
			}
			if !comes && (ok || took < detachAfter) {
				t.Errorf("no mounter came: mounted %v after %v, want detached after %v", ok, took, detachAfter)
			}
		})
	}
}

// TestFDHolderRefusesForeignMounts: a mount put whose mountpoint is not in
// the holder's mounts directory (a real FUSE mount elsewhere), whose key
// is not its reference's, or whose descriptor is not /dev/fuse (a pipe,
// a regular file) is refused; stopped with no mounter, the holder then
// detaches nothing: the FUSE mount outside stays mounted.
func TestFDHolderRefusesForeignMounts(t *testing.T) {
	outside, master := fuseMount(t)
	mountsDir := t.TempDir()
	sock, stop := startHolder(t, mountsDir, 200*time.Millisecond)
	var c *net.UnixConn
	var err error
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
	if err := call(c, fdMessage{Op: opHello}, nil); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "regular"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	inside := filepath.Join(mountsDir, "aaa")
	otherKey := testMount()
	otherKey.Mountpoint, otherKey.Key = inside, "r.example/other@sha256:"+strings.Repeat("a", 64)
	for _, p := range []struct {
		name, mp string
		m        *heldMount
		f        *os.File
		want     string
	}{
		{"in a subdirectory of it", filepath.Join(mountsDir, "sub", "aaa"), nil, master, "not in the mounts directory"},
		{"the mounts directory itself", mountsDir, nil, master, "not in the mounts directory"},
		{"another key", "", otherKey, master, "key is not its reference's"},
		{"a pipe", inside, nil, w, "not /dev/fuse"},
		{"a regular file", inside, nil, file, "not /dev/fuse"},
		{"outside the mounts directory", outside, nil, master, "not in the mounts directory"}, // last: it would replace the others
	} {
		m := p.m
		if m == nil {
			m = testMount()
			m.Mountpoint = p.mp
		}
		err := call(c, fdMessage{Op: opPut, Mount: m}, p.f)
		if err == nil || !strings.Contains(err.Error(), p.want) {
			t.Errorf("put of a mount %s: %v, want refused (%q)", p.name, err, p.want)
		}
	}
	// Nothing was kept.
	if err := writeFD(c, fdMessage{Op: opList}, nil); err != nil {
		t.Fatal(err)
	}
	for {
		m, f, err := readFD(c)
		if err != nil {
			t.Fatal(err)
		}
		if m.Op == opEnd {
			break
		}
		f.Close()
		t.Errorf("the holder keeps a refused mount: %s", m.Mount.String())
	}
	c.Close()
	stop()
	if _, ok := mountedAt(t, outside); !ok {
		t.Fatal("the holder detached a FUSE mount outside its mounts directory")
	}
}
