package mounts

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// fusectlDir is where the kernel's fusectl file system lists FUSE
// connections, one directory per connection named by its device number.
const fusectlDir = "/sys/fs/fuse/connections"

// connOf returns the FUSE connection serving the mount at mp: the device
// number of its file system, "" when it cannot be read.
func connOf(mp string) string {
	var st unix.Stat_t
	if err := unix.Stat(mp, &st); err != nil {
		return ""
	}
	return strconv.FormatUint(uint64(unix.Minor(st.Dev)), 10)
}

// abortConn aborts FUSE connection id through fusectl, mounting fusectl
// first where it is not (root only): every request on it fails with
// ENOTCONN and its server's reads end, whatever still mounts it.
func abortConn(id string) error {
	if id == "" {
		return errors.New("fuse connection unknown")
	}
	abort := filepath.Join(fusectlDir, id, "abort")
	if _, err := os.Stat(abort); os.IsNotExist(err) {
		if err := unix.Mount("fusectl", fusectlDir, "fusectl", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return &os.PathError{Op: "mount fusectl", Path: fusectlDir, Err: err}
		}
	}
	return os.WriteFile(abort, []byte("1"), 0)
}
