package pull

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

// exchange swaps, atomically, the entries at name in dfd and at other in
// odfd (renameat2 RENAME_EXCHANGE); both must exist. It wraps
// errors.ErrUnsupported where the file system cannot.
func exchange(dfd int, name string, odfd int, other string) error {
	err := unix.Renameat2(dfd, name, odfd, other, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("renameat2 RENAME_EXCHANGE: %v: %w", err, errors.ErrUnsupported)
	}
	return err
}

// renameNoReplace renames name in dfd to other in odfd unless something
// is at other (renameat2 RENAME_NOREPLACE: EEXIST). It wraps
// errors.ErrUnsupported where the file system cannot.
func renameNoReplace(dfd int, name string, odfd int, other string) error {
	err := unix.Renameat2(dfd, name, odfd, other, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("renameat2 RENAME_NOREPLACE: %v: %w", err, errors.ErrUnsupported)
	}
	return err
}
