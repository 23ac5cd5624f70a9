package mounts

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// stuckRoot is a FUSE root whose statfs blocks until release is closed: a
// server that is alive but does not answer.
type stuckRoot struct {
	fs.Inode
	release chan struct{}
}

func (r *stuckRoot) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	<-r.release
	return 0
}

// TestNotConnectedIsBoundedOnAStuckServer: a mount whose server never
// answers statfs is reported within the bound, as not known to be gone
// (a live, stuck server), instead of hanging the caller; once the server
// stops, the mount is reported gone.
func TestNotConnectedIsBoundedOnAStuckServer(t *testing.T) {
	requireFUSE(t)
	root := &stuckRoot{release: make(chan struct{})}
	mp := t.TempDir()
	srv, err := fs.Mount(mp, root, &fs.Options{MountOptions: fuse.MountOptions{FsName: "bdnvol-stuck-test", DirectMount: os.Geteuid() == 0}})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			close(root.release)
		}
	}
	t.Cleanup(func() { release(); srv.Unmount() })

	start := time.Now()
	done := make(chan bool, 1)
	go func() { done <- notConnectedWithin(mp, 300*time.Millisecond) }()
	select {
	case gone := <-done:
		if gone {
			t.Error("a live server that does not answer was reported gone")
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("took %v with a 300ms bound", took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("NotConnected hangs on a stuck server")
	}
	release()
	if notConnectedWithin(mp, 5*time.Second) {
		t.Error("an answering server was reported gone")
	}
}
