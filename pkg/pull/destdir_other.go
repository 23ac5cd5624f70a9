//go:build !linux

package pull

import (
	"errors"

	"golang.org/x/sys/unix"
)

// chmodNoRead sets the mode of the directory name in pfd, which this user
// may not open for reading, without following a symlink in its place.
func chmodNoRead(pfd int, name string, mode uint32) error {
	return unix.Fchmodat(pfd, name, mode, unix.AT_SYMLINK_NOFOLLOW)
}

// exchange is not available here: renames replace.
func exchange(dfd int, name string, odfd int, other string) error {
	return errors.ErrUnsupported
}

// renameNoReplace is not available here: renames replace.
func renameNoReplace(dfd int, name string, odfd int, other string) error {
	return errors.ErrUnsupported
}
