package chunkcache

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// reserve allocates size bytes for f, so that a full disk is found before
// any byte is fetched. File systems without fallocate are not an error.
func reserve(f *os.File, size int64) error {
	if size == 0 {
		return nil
	}
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return nil
	}
	return err
}
