package layout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// ReadAtCloser is a file opened for reading at any offset.
type ReadAtCloser interface {
	io.ReaderAt
	io.Closer
}

// Source is a tree to seal: a local directory, or a remote store that a
// sync streams from.
type Source interface {
	// Walk lists the tree, sorted by path, without following symlinks.
	Walk(ctx context.Context) ([]Entry, error)
	// Open opens the regular file at the slash-separated path p.
	Open(ctx context.Context, p string) (ReadAtCloser, error)
	// String names the source in errors.
	String() string
}

// Remote is implemented by sources whose files are expensive to read twice;
// Push then keeps each chunk in memory until it is uploaded, instead of
// reading it again from the source.
type Remote interface {
	Remote() bool
}

// DirSource returns the directory root as a Source.
func DirSource(root string) Source { return dirSource(root) }

type dirSource string

func (d dirSource) Walk(context.Context) ([]Entry, error) { return Walk(string(d)) }

// Open opens the file at p without following a symlink or blocking on a
// FIFO (either may have replaced the file since the walk) and refuses
// anything but a regular file.
func (d dirSource) Open(_ context.Context, p string) (ReadAtCloser, error) {
	full := filepath.Join(string(d), filepath.FromSlash(p))
	f, err := os.OpenFile(full, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s: %w: became a symlink", full, ErrUnsupportedFile)
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w: %s", full, ErrUnsupportedFile, fi.Mode().Type())
	}
	return f, nil
}

func (d dirSource) String() string { return string(d) }
