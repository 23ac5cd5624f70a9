package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/ociarchive"
)

// archiveRef parses oci-archive:FILE[:TAG|@DIGEST]: the file, and the
// reference with its tag or digest (Layout is the file until staged).
func archiveRef(s string) (ref oci.Ref, ok bool, err error) {
	rest, ok := strings.CutPrefix(s, ociarchive.Prefix)
	if !ok {
		return oci.Ref{}, false, nil
	}
	ref, err = oci.ParseRef(oci.LayoutPrefix + rest)
	if err != nil {
		return oci.Ref{}, true, usageError{fmt.Errorf("%s: %w", s, err)}
	}
	return ref, true, nil
}

// openArchive extracts the archive ref names (every blob verified against
// its name) into a staging directory and returns the layout reference
// there; cleanup removes it.
func openArchive(ctx context.Context, ref oci.Ref) (staged oci.Ref, cleanup func(), err error) {
	f, err := os.Open(ref.Layout)
	if err != nil {
		return oci.Ref{}, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return oci.Ref{}, nil, err
	}
	if !fi.Mode().IsRegular() {
		return oci.Ref{}, nil, fmt.Errorf("%s: %w: not a regular file", ref.Layout, ociarchive.ErrBadArchive)
	}
	dir, err := os.MkdirTemp("", "bdnvol-archive-")
	if err != nil {
		return oci.Ref{}, nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	if err := ociarchive.Extract(ctx, f, fi.Size(), dir); err != nil {
		cleanup()
		return oci.Ref{}, nil, fmt.Errorf("%s: %w", ref.Layout, err)
	}
	staged = ref
	staged.Layout = dir
	return staged, cleanup, nil
}

// sinceTarget is an archive's staging layout that counts the blobs of the
// version a receiving site holds as present, so that they are not copied.
type sinceTarget struct {
	oci.Target
	have map[digest.Digest]bool
}

// Exists reports the blobs of the version the site holds as present.
func (t sinceTarget) Exists(ctx context.Context, d ocispec.Descriptor) (bool, error) {
	if t.have[d.Digest] {
		return true, nil
	}
	return t.Target.Exists(ctx, d)
}

// sinceSet resolves since (a version the receiving site holds) and returns
// every blob and manifest under it.
func sinceSet(ctx context.Context, g *Globals, since string) (map[digest.Digest]bool, error) {
	ref, err := oci.ParseRef(since)
	if err != nil {
		return nil, usageError{fmt.Errorf("--since: %w", err)}
	}
	if ref.Reference() == "" {
		return nil, usageError{fmt.Errorf("--since %s: name a version (a tag or a digest)", since)}
	}
	t, err := oci.Open(ctx, ref, g.options())
	if err != nil {
		return nil, err
	}
	root, err := oci.Resolve(ctx, t, ref)
	if err != nil {
		return nil, fmt.Errorf("--since %s: %w", since, err)
	}
	return ociarchive.Reachable(ctx, t, root)
}

// missingHint explains a copy from an archive that lacks a blob: it was
// written with --since for a site that holds an earlier version.
func missingHint(err error, fromArchive bool) error {
	if fromArchive && (errors.Is(err, errdef.ErrNotFound) || errors.Is(err, os.ErrNotExist)) {
		return fmt.Errorf("%w (the archive lacks a blob the destination does not have either: it was written with --since for a site that holds an earlier version; copy that version to the destination first)", err)
	}
	return err
}
