package lazy

import (
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

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
