package layout

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// dirOpenFlags open a directory only to resolve names in it.
const dirOpenFlags = unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC

// openBeneath opens the directory rel under the destination with openat2,
// which refuses symlinks anywhere on the way and any escape from the root;
// where the kernel lacks openat2 it resolves one element at a time.
func (d *destDir) openBeneath(rel string) (int, error) {
	if !d.noOpenat2.Load() {
		fd, err := unix.Openat2(d.root, rel, &unix.OpenHow{
			Flags:   dirOpenFlags,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
			return fd, err
		}
		d.noOpenat2.Store(true)
	}
	return d.openStepwise(rel)
}

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
