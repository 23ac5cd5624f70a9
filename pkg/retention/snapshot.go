package retention

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// Snapshot reads what a plan is made from: the versions and tombstones of
// t, and the references sources gives now.
func Snapshot(ctx context.Context, t oci.Target, sources Sources) (Input, error) {
	var in Input
	vs, err := versions.List(ctx, t)
	if err != nil {
		return in, err
	}
	in.Versions = vs
	if in.Deleted, err = ListDeleted(ctx, t); err != nil {
		return in, err
	}
	if in.References, err = sources(ctx); err != nil {
		return in, err
	}
	return in, nil
}

// FileSources returns the references to repo in the files and directories
// in paths (read at each call), in stdin (named "stdin"; nil when there is
// none) and those more returns (nil: none). It fails now on a path it
// cannot read.
func FileSources(repo oci.Ref, paths []string, stdin []byte, more func() []Reference) (Sources, error) {
	if _, err := ScanPaths(repo, paths); err != nil {
		return nil, err
	}
	return func(context.Context) ([]Reference, error) {
		refs, err := ScanPaths(repo, paths)
		if err != nil {
			return nil, err
		}
		if stdin != nil {
			refs = append(refs, Scan(repo, "stdin", stdin)...)
		}
		if more != nil {
			refs = append(refs, more()...)
		}
		return refs, nil
	}, nil
}

// ErrStdinTwice is returned when standard input is named twice as a source.
var ErrStdinTwice = errors.New("standard input named twice")

// PathSources is FileSources of paths where "-" names stdin, read once,
// now.
func PathSources(repo oci.Ref, paths []string, stdin io.Reader, more func() []Reference) (Sources, error) {
	var files []string
	var in []byte
	for _, p := range paths {
		if p != "-" {
			files = append(files, p)
			continue
		}
		if in != nil {
			return nil, ErrStdinTwice
		}
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("refs: standard input: %w", err)
		}
		in = append([]byte{}, b...)
	}
	return FileSources(repo, files, in, more)
}
