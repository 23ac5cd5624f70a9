// Package beneath opens files and directories under a directory descriptor
// without following a symlink anywhere on the way and without leaving the
// directory: with openat2 (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) where the
// kernel has it, otherwise one element at a time with O_NOFOLLOW.
package beneath

import (
	"errors"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Resolver opens paths under directory descriptors. The zero value is ready
// to use.
type Resolver struct {
	// Stepwise makes Open resolve one element at a time. Open sets it the
	// first time openat2 is missing or refused (ENOSYS, EPERM under some
	// seccomp filters); tests set it to exercise the fallback.
	Stepwise atomic.Bool
}

// Open opens rel, a slash-separated relative path, under the directory dfd
// with flags (O_NOFOLLOW is added) and returns the descriptor. No element of
// rel may be a symlink, empty, "." or ".."; with O_DIRECTORY in flags, rel
// must name a directory. The error is the bare errno: see Unsafe.
func (r *Resolver) Open(dfd int, rel string, flags int) (int, error) {
	for el := range strings.SplitSeq(rel, "/") {
		if el == "" || el == "." || el == ".." {
			return -1, unix.EINVAL
		}
	}
	if !r.Stepwise.Load() {
		fd, err := openat2(dfd, rel, flags|unix.O_NOFOLLOW)
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
			return fd, err
		}
		r.Stepwise.Store(true)
	}
	return openStepwise(dfd, rel, flags|unix.O_NOFOLLOW)
}

// Unsafe reports whether err from Open means something on the way is not
// what it has to be: a symlink (ELOOP), a file where a directory has to be
// (ENOTDIR), or a way out of the directory (EXDEV, EINVAL).
func Unsafe(err error) bool {
	return errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL)
}

// openStepwise resolves rel one element at a time, each directory opened
// with O_NOFOLLOW from the descriptor of its parent and checked to be one:
// the fallback where openat2 is missing.
func openStepwise(dfd int, rel string, flags int) (int, error) {
	els := strings.Split(rel, "/")
	cur := dfd
	closeCur := func() {
		if cur != dfd {
			unix.Close(cur)
		}
	}
	for i, el := range els {
		last := i == len(els)-1
		fl := DirFlags | unix.O_NOFOLLOW
		if last {
			fl = flags
		}
		next, err := unix.Openat(cur, el, fl, 0)
		closeCur()
		if err != nil {
			return -1, err
		}
		cur = next
		if last && flags&unix.O_DIRECTORY == 0 {
			break
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			closeCur()
			return -1, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			closeCur()
			return -1, unix.ENOTDIR
		}
	}
	return cur, nil
}
