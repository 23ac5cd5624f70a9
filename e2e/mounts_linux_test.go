package e2e

import (
	"fmt"
	"syscall"
)

// bindShared bind-mounts dir on itself and makes it rshared, as kubelet's
// root directory is on a node.
func bindShared(dir string) error {
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s on itself: %w", dir, err)
	}
	if err := syscall.Mount("", dir, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s rshared: %w", dir, err)
	}
	return nil
}

// detachMount unmounts mp lazily, ignoring errors (a cleanup).
func detachMount(mp string) { syscall.Unmount(mp, syscall.MNT_DETACH) }

// unmountNow unmounts mp, failing when it is busy.
func unmountNow(mp string) error { return syscall.Unmount(mp, 0) }

// mountTmpfsAt mounts a tmpfs with options opts on dir.
func mountTmpfsAt(dir, opts string) error { return syscall.Mount("tmpfs", dir, "tmpfs", 0, opts) }
