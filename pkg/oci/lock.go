package oci

import (
	"context"
	"fmt"
	"os"
	"syscall"
)

// LockLayout takes an exclusive lock on the OCI layout r names, so that
// processes changing one layout's index.json take turns, and returns its
// release. A registry needs no lock (every change there is one request):
// for one, LockLayout does nothing.
func LockLayout(r Ref) (func(), error) {
	if r.Layout == "" {
		return func() {}, nil
	}
	// O_DIRECTORY and O_NONBLOCK: the layout must be a directory; a FIFO
	// there would block open(2).
	f, err := os.OpenFile(r.Layout, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", r.Repo(), ErrNotFound, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", r.Repo(), err)
	}
	return func() { f.Close() }, nil
}

// OpenLocked opens the repository r names, first locking it (LockLayout)
// when lock is set, for a command that changes it; the returned function
// releases the lock.
func OpenLocked(ctx context.Context, r Ref, opt Options, lock bool) (Target, func(), error) {
	unlock := func() {}
	if lock {
		var err error
		if unlock, err = LockLayout(r); err != nil {
			return nil, nil, err
		}
	}
	t, err := Open(ctx, r, opt)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return t, unlock, nil
}
