package push

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/internal/beneath"
	"github.com/bdnvol/bdnvol/pkg/layout"
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

// walkList is Walk, held compactly (a push of a directory takes this).
func (d dirSource) walkList(context.Context) (*walkList, error) { return walkDir(string(d)) }

// compactWalker is a Source that can give its walk compactly.
type compactWalker interface {
	walkList(context.Context) (*walkList, error)
}

// sourceRes opens the files of directory sources.
var sourceRes beneath.Resolver

// Open opens the file at p relative to a descriptor of the root, following
// no symlink on the way (a directory or the file itself may have been
// swapped for one since the walk) and never blocking on a FIFO, and refuses
// anything but a regular file.
func (d dirSource) Open(_ context.Context, p string) (ReadAtCloser, error) {
	full := filepath.Join(string(d), filepath.FromSlash(p))
	root, err := unix.Open(string(d), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: string(d), Err: err}
	}
	fd, err := sourceRes.Open(root, p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC)
	unix.Close(root)
	if err != nil {
		if beneath.Unsafe(err) {
			return nil, fmt.Errorf("%s: %w: it or a directory on its way became a symlink or a file since the walk (%v)", full, layout.ErrUnsupportedFile, err)
		}
		return nil, &os.PathError{Op: "open", Path: full, Err: err}
	}
	f := os.NewFile(uintptr(fd), full)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w: %s", full, layout.ErrUnsupportedFile, fi.Mode().Type())
	}
	return f, nil
}

func (d dirSource) String() string { return string(d) }
