//go:build !linux

package beneath

import "golang.org/x/sys/unix"

// DirFlags open a directory only to resolve names in it.
const DirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC

// openat2 is missing outside Linux: Open resolves one element at a time.
func openat2(int, string, int) (int, error) { return -1, unix.ENOSYS }
