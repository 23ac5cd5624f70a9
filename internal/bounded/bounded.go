// Package bounded reads files and streams whose size input decides, at
// most a given number of bytes of them: the one way bdnvol reads a small
// file it did not write itself (a key, a layout's index.json, a profile, a
// cache record).
package bounded

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ErrTooLarge is wrapped when there are more bytes than the bound.
var ErrTooLarge = errors.New("too large")

// ErrNotRegular is wrapped when a file to read is not a regular file (a
// FIFO, a device, a socket, a directory).
var ErrNotRegular = errors.New("not a regular file")

// Read reads r to its end, at most max bytes: more is ErrTooLarge, after
// reading max+1 bytes and no more.
func Read(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, max)
	}
	return b, nil
}

// ReadRegular reads f, which must be a regular file (ErrNotRegular) of at
// most max bytes (ErrTooLarge, before a byte is read when its size says
// so; a file that grows while read is cut at max+1 bytes).
func ReadRegular(f *os.File, max int64) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w (%s)", ErrNotRegular, kind(fi.Mode()))
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrTooLarge, fi.Size(), max)
	}
	return Read(f, max)
}

// ReadFile reads the regular file at path, of at most max bytes, as
// ReadRegular does. It opens it without blocking, so that a FIFO there is
// refused instead of waited on.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadRegular(f, max)
}

// kind names the type of a file that is not a regular one.
func kind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeDevice != 0:
		return "a device"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return "type " + m.Type().String()
}
