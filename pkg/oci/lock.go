package oci

import (
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
	f, err := os.Open(r.Layout)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.Repo(), ErrNotFound)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", r.Repo(), err)
	}
	return func() { f.Close() }, nil
}
