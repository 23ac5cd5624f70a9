//go:build !linux

package e2e

import "errors"

// bindShared is Linux only: the cluster tests run a Linux kubelet.
func bindShared(dir string) error {
	return errors.New("the cluster tests need Linux")
}

// detachMount is Linux only.
func detachMount(mp string) {}

// unmountNow is Linux only.
func unmountNow(mp string) error { return errors.New("linux only") }

// mountTmpfsAt is Linux only.
func mountTmpfsAt(dir, opts string) error { return errors.New("tmpfs mounts need Linux") }
