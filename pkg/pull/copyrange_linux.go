package pull

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
//
// A file system that shares extents (XFS, btrfs) clones only whole blocks
// at block-aligned offsets, and copies the whole range byte by byte when
// either offset is not aligned. So where both offsets sit at the same place
// within a block (an unchanged tensor of a fine-tune stays where it was),
// the bytes up to the first block boundary are copied on their own, and the
// rest starts aligned: the kernel clones its whole blocks and copies only
// the partial block at its end.
func copyRange(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) error {
	if head := cloneHead(dstOff, srcOff, n); head > 0 {
		if err := copyRangeAt(dst, dstOff, src, srcOff, head); err != nil {
			return err
		}
		dstOff, srcOff, n = dstOff+head, srcOff+head, n-head
	}
	return copyRangeAt(dst, dstOff, src, srcOff, n)
}

// cloneBlock is the block size copyRange aligns to: 4 KiB, the block of
// XFS, btrfs and ext4 as made by default.
const cloneBlock = 4 << 10

// cloneHead returns how many bytes at the start of a copy of n bytes lie
// before the first block boundary, when copying those on their own lets the
// rest be cloned by whole blocks: both offsets are at the same place within
// a block, not on its start, and at least one whole block follows. Else 0.
func cloneHead(dstOff, srcOff, n int64) int64 {
	within := dstOff % cloneBlock
	if within == 0 || srcOff%cloneBlock != within {
		return 0
	}
	head := cloneBlock - within
	if n-head < cloneBlock {
		return 0
	}
	return head
}

// copyRangeAt is copyRange without the alignment split.
func copyRangeAt(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) error {
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
