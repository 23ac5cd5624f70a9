//go:build !linux

package pull

import (
	"errors"
	"os"
)

// copyRange is copy_file_range where the kernel has it; elsewhere callers
// copy the hashed way.
func copyRange(*os.File, int64, *os.File, int64, int64) error { return errors.ErrUnsupported }
