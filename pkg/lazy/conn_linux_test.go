package lazy

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestConnChangesHands serves a tree with MountConn, drains it, and serves
// the same kernel mount from a second Conn made from a copy of its master
// descriptor (as a successor process would): names looked up and files
// opened under the first are read under the second, with no error and the
// right bytes, and a listing is the same.
func TestConnChangesHands(t *testing.T) {
	needConnMount(t)
	fx, kinds := treeFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	mnt := t.TempDir()
	c, err := MountConn(mnt, v, ConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	track := mountCleanup(t, mnt)
	list := func() []string {
		var out []string
		filepath.Walk(mnt, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			if p != mnt {
				out = append(out, p[len(mnt)+1:])
			}
			return nil
		})
		sort.Strings(out)
		return out
	}
	before := list()
	if len(before) != len(kinds) {
		t.Fatalf("listed %d entries, want %d: %v", len(before), len(kinds), before)
	}
	open, err := os.Open(filepath.Join(mnt, "b/big"))
	if err != nil {
		t.Fatal(err)
	}
	track(open)
	want := fx.files["b/big"]
	head := make([]byte, 4096)
	if _, err := open.ReadAt(head, 0); err != nil || !bytes.Equal(head, want[:4096]) {
		t.Fatalf("first read: %v", err)
	}

	dup, err := unix.Dup(int(c.Master().Fd()))
	if err != nil {
		t.Fatal(err)
	}
	init := c.Init()
	c.Drain()
	c.Master().Close() // as the predecessor exiting
	// Nobody serves now: a read waits in the kernel's queue.
	got := make(chan error, 1)
	buf := make([]byte, 100<<10)
	go func() { _, err := open.ReadAt(buf, 200<<10); got <- err }()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("a read with nobody serving returned %v; want it to wait", err)
	default:
	}
	c2, err := ResumeConn(os.NewFile(uintptr(dup), "/dev/fuse"), init, mnt, v, ConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the queued read: %v", err)
	}
	if !bytes.Equal(buf, want[200<<10:300<<10]) {
		t.Error("the queued read returned wrong bytes")
	}
	if after := list(); !equal(after, before) {
		t.Errorf("after the handoff the tree lists %v, want %v", after, before)
	}
	for p, b := range fx.files {
		g, err := os.ReadFile(filepath.Join(mnt, p))
		if err != nil || !bytes.Equal(g, b) {
			t.Errorf("%s after the handoff: %v", p, err)
		}
	}
	if target, err := os.Readlink(filepath.Join(mnt, "b/link")); err != nil || target != "../a/y/z" {
		t.Errorf("readlink b/link = %q, %v", target, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Error(err)
	}
	sz, err := unix.Getxattr(mnt, XattrDigest, make([]byte, 128))
	if err != nil || sz != len(v.Root().Digest.String()) {
		t.Errorf("digest xattr: %d %v", sz, err)
	}
	open.Close()
	if err := c2.Unmount(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the connection did not end after Unmount")
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestConnCrashFailsInFlightReads: a server that goes away with a request
// read but unanswered (a crash) while another process holds the master:
// the kernel ends that request, and the reader's read is re-sent and
// answered by a new server on the master (or fails with ECONNABORTED),
// never hangs; the next reads get the right bytes.
func TestConnCrashFailsInFlightReads(t *testing.T) {
	needConnMount(t)
	fx, _ := treeFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	mnt := t.TempDir()
	c, err := MountConn(mnt, v, ConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	track := mountCleanup(t, mnt)
	open, err := os.Open(filepath.Join(mnt, "b/big"))
	if err != nil {
		t.Fatal(err)
	}
	track(open)
	held, err := unix.Dup(int(c.Master().Fd())) // the fd holder's copy
	if err != nil {
		t.Fatal(err)
	}
	fx.fetch.mu.Lock()
	fx.fetch.delay = 3 * time.Second // the read stays in flight
	fx.fetch.mu.Unlock()
	got := make(chan error, 1)
	buf := make([]byte, 64<<10)
	go func() { _, err := open.ReadAt(buf, 128<<10); got <- err }()
	time.Sleep(300 * time.Millisecond)
	crashed := time.Now()
	// The crash: the process's descriptors close with a request read and
	// unanswered. (Here the idle readers are woken first: their poll holds
	// the clone, which a dying process's would not.)
	unix.Write(c.stopFd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	time.Sleep(100 * time.Millisecond)
	c.clone.Close()
	c.master.Close()
	fx.fetch.mu.Lock()
	fx.fetch.delay = 0
	fx.fetch.mu.Unlock()
	time.Sleep(500 * time.Millisecond) // no server at all for a while
	c2, err := ResumeConn(os.NewFile(uintptr(held), "/dev/fuse"), c.Init(), mnt, v, ConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		// The kernel either re-sends the page read (then the new server
		// answers it) or fails it with ECONNABORTED.
		t.Logf("MEASURE a read in flight in a crashed server: %v after %v", err, time.Since(crashed).Round(time.Microsecond))
		if err != nil && !errors.Is(err, unix.ECONNABORTED) {
			t.Errorf("the read in flight: %v, want success or ECONNABORTED", err)
		}
		if err == nil && !bytes.Equal(buf, fx.files["b/big"][128<<10:192<<10]) {
			t.Error("the read in flight, answered again, returned wrong bytes")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read in flight in a crashed server hangs after a new server came")
	}
	if _, err := open.ReadAt(buf, 128<<10); err != nil || !bytes.Equal(buf, fx.files["b/big"][128<<10:192<<10]) {
		t.Errorf("the read again on the new server: %v", err)
	}
	open.Close()
	if err := c2.Unmount(2 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// needConnMount fails (under CI=true) or skips the test unless FUSE is
// usable and the test runs as root, which MountConn's mount(2) needs.
func needConnMount(t *testing.T) {
	t.Helper()
	needFUSE(t)
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("MountConn needs root under CI=true")
		}
		t.Skip("MountConn needs root")
	}
}
