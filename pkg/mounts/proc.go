package mounts

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// NotConnected reports whether mp is a FUSE mount whose server is gone.
// statfs always reaches the server (stat may be answered from the kernel's
// attribute cache). A server that does not answer within statfsWait (alive
// but stuck) is not known to be gone: NotConnected then reports false
// rather than waiting for it, so that listing mounts or planning gc never
// hangs on one wedged mount.
func NotConnected(mp string) bool {
	return notConnectedWithin(mp, statfsWait)
}

// statfsWait bounds how long NotConnected waits for a mount's server.
var statfsWait = 2 * time.Second

// notConnectedWithin is NotConnected with its bound: the statfs runs in a
// goroutine that a stuck server may keep (it ends when the server answers
// or its connection is aborted).
func notConnectedWithin(mp string, wait time.Duration) bool {
	res := make(chan error, 1)
	go func() {
		var st syscall.Statfs_t
		res <- syscall.Statfs(mp, &st)
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-res:
		return errors.Is(err, syscall.ENOTCONN)
	case <-t.C:
		return false
	}
}

// Detach unmounts mp lazily: it disappears now, and the kernel lets go of
// it when the last open file is closed.
func Detach(mp string) error {
	if err := syscall.Unmount(mp, mntDetach); err == nil {
		return nil
	}
	var last error
	for _, tool := range []string{"fusermount3", "fusermount"} {
		out, err := exec.Command(tool, "-u", "-z", mp).CombinedOutput()
		if err == nil {
			return nil
		}
		last = errors.New(strings.TrimSpace(string(out)))
		if len(out) == 0 {
			last = err
		}
	}
	return fmt.Errorf("detach %s: %w", mp, last)
}

// UnmountFUSE unmounts mp, failing when it is busy: with umount(2) when
// allowed (root), else with fusermount3.
func UnmountFUSE(mp string) error {
	err := syscall.Unmount(mp, 0)
	if err == nil || !errors.Is(err, syscall.EPERM) {
		return err
	}
	for _, tool := range []string{"fusermount3", "fusermount"} {
		out, ferr := exec.Command(tool, "-u", mp).CombinedOutput()
		if ferr == nil {
			return nil
		}
		if len(out) > 0 {
			err = errors.New(strings.TrimSpace(string(out)))
		}
	}
	return err
}
