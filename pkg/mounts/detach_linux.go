package mounts

import "syscall"

// mntDetach makes unmount(2) lazy: the mount goes away now and is freed
// when its last file is closed.
const mntDetach = syscall.MNT_DETACH
