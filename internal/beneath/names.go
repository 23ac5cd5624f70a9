package beneath

import (
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Names returns the names in the directory dfd, sorted; full names it in
// errors.
func Names(dfd int, full string) ([]string, error) {
	fd, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: full, Err: err}
	}
	dh := os.NewFile(uintptr(fd), full)
	defer dh.Close()
	names, err := dh.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// Readlink returns the target of the symbolic link name in the directory
// dfd, read into a buffer of max+1 bytes: a target longer than max shows as
// longer than max (cut at max+1 bytes), for the caller to refuse.
func Readlink(dfd int, name string, max int) (string, error) {
	buf := make([]byte, max+1)
	n, err := unix.Readlinkat(dfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
