package layout

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// copyRange copies n bytes at srcOff of src to dstOff of dst inside the
// kernel (copy_file_range: a reflink where the file system shares extents).
// It wraps errors.ErrUnsupported when the kernel cannot do it for these
// files, before anything was copied.
func copyRange(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) error {
	roff, woff := srcOff, dstOff
	for done := int64(0); done < n; {
		k, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(min(n-done, 1<<30)), 0)
		if err != nil {
			if done == 0 && (errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
				return fmt.Errorf("copy_file_range %s → %s: %v: %w", src.Name(), dst.Name(), err, errors.ErrUnsupported)
			}
			return &os.PathError{Op: "copy_file_range", Path: dst.Name(), Err: err}
		}
		if k == 0 {
			return fmt.Errorf("copy_file_range %s: %d of %d bytes: %w", src.Name(), done, n, errors.ErrUnsupported)
		}
		done += int64(k)
	}
	return nil
}
