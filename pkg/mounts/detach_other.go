//go:build !linux

package mounts

import "golang.org/x/sys/unix"

// mntDetach forces the unmount where a lazy one does not exist.
const mntDetach = unix.MNT_FORCE
