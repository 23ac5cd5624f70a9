package layout

import (
	"context"
	"io"
	"os"
	"path/filepath"
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

func (d dirSource) Open(_ context.Context, p string) (ReadAtCloser, error) {
	return os.Open(filepath.Join(string(d), filepath.FromSlash(p)))
}

func (d dirSource) String() string { return string(d) }
