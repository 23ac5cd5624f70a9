package layout

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// chmodNoRead sets the mode of the directory name in pfd, which this user
// may not open for reading, through an O_PATH descriptor of it.
func chmodNoRead(pfd int, name string, mode uint32) error {
	fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	err = unix.Fchmodat(fd, "", mode, unix.AT_EMPTY_PATH)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		// Before fchmodat2: the descriptor's entry in /proc is the
		// directory itself, not a path that can be swapped.
		err = unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), mode)
	}
	return err
}
