//go:build !linux

package layout

import "golang.org/x/sys/unix"

// dirOpenFlags open a directory only to resolve names in it.
const dirOpenFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC

// openBeneath opens the directory rel under the destination one element at
// a time, refusing symlinks.
func (d *destDir) openBeneath(rel string) (int, error) { return d.openStepwise(rel) }

// chmodNoRead sets the mode of the directory name in pfd, which this user
// may not open for reading, without following a symlink in its place.
func chmodNoRead(pfd int, name string, mode uint32) error {
	return unix.Fchmodat(pfd, name, mode, unix.AT_SYMLINK_NOFOLLOW)
}
