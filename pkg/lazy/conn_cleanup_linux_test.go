package lazy

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain removes the dead FUSE mounts an earlier run of these tests left
// (a run killed, or stopped by -timeout, runs no cleanup), then runs the
// tests.
func TestMain(m *testing.M) {
	sweepDeadTestMounts()
	os.Exit(m.Run())
}

// sweepDeadTestMounts detaches every bdnvol FUSE mount under the temporary
// directory that a test made (its path starts with "Test") and whose server
// is gone (statfs fails with ENOTCONN). A live mount, such as another test
// binary's running now, answers statfs and is left alone; one that does not
// answer within a second is left alone too.
func sweepDeadTestMounts() {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	prefix := filepath.Join(os.TempDir(), "Test")
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		sep := -1
		for i, s := range fl {
			if s == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fl) || len(fl) < 5 || !strings.HasPrefix(fl[sep+1], "fuse."+FsType) || !strings.HasPrefix(fl[4], prefix) {
			continue
		}
		if mp := fl[4]; deadMount(mp) {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err == nil {
				fmt.Fprintf(os.Stderr, "removed a dead FUSE mount an earlier test run left: %s\n", mp)
			}
		}
	}
}

// deadMount reports whether the FUSE mount at mp has no server (ENOTCONN),
// waiting at most a second for an answer.
func deadMount(mp string) bool {
	res := make(chan error, 1)
	go func() {
		var st unix.Statfs_t
		res <- unix.Statfs(mp, &st)
	}()
	select {
	case err := <-res:
		return errors.Is(err, unix.ENOTCONN)
	case <-time.After(time.Second):
		return false
	}
}

// mountCleanup makes sure the FUSE mount at mnt is gone when the test ends,
// however it ends (a failure with a read queued and nobody serving
// included): it aborts the connection, so that no request waits for a
// server, then closes the files given to track (a close of a FUSE file
// waits for its FLUSH) and detaches the mount. Register it right after the
// mount; track every file opened on the mount instead of deferring its
// close, since a deferred close runs before cleanups.
func mountCleanup(t *testing.T, mnt string) (track func(*os.File)) {
	t.Helper()
	var mu sync.Mutex
	var files []*os.File
	t.Cleanup(func() {
		// The connection mounted at mnt now: a minor number read earlier
		// may have been reused by someone else's mount since.
		if id := connOf(mnt); id != "" {
			os.WriteFile("/sys/fs/fuse/connections/"+id+"/abort", []byte("1"), 0)
		}
		mu.Lock()
		for _, f := range files {
			f.Close()
		}
		mu.Unlock()
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			t.Errorf("detach %s: %v", mnt, err)
		}
	})
	return func(f *os.File) {
		mu.Lock()
		files = append(files, f)
		mu.Unlock()
	}
}

// TestConnSweepRemovesDeadTestMounts: a FUSE mount left by a test run that
// died (its descriptor closed, the mount still there) is detached by the
// sweep TestMain runs; a live one is left alone.
func TestConnSweepRemovesDeadTestMounts(t *testing.T) {
	needFUSE(t)
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("mount(2) needs root under CI=true")
		}
		t.Skip("mount(2) needs root")
	}
	mount := func() (string, int) {
		dir, err := os.MkdirTemp("", "TestConnSweep")
		if err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("bdnvol:test", dir, "fuse."+FsType, unix.MS_RDONLY, fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if id := connOf(dir); id != "" {
				os.WriteFile("/sys/fs/fuse/connections/"+id+"/abort", []byte("1"), 0)
			}
			unix.Unmount(dir, unix.MNT_DETACH)
			unix.Close(fd)
			os.Remove(dir)
		})
		return dir, fd
	}
	dead, fd := mount()
	unix.Close(fd)     // the server died: statfs fails with ENOTCONN
	live, _ := mount() // nobody answers: not known to be dead
	sweepDeadTestMounts()
	if connOf(dead) != "" {
		t.Error("a dead test mount was not swept")
	}
	if connOf(live) == "" {
		t.Error("a mount whose server did not answer was swept")
	}
}
