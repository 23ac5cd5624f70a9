package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/beneath"
	"github.com/bdnvol/bdnvol/internal/verify"
)

// blobPath returns the file of the blob d.
func (s *layoutStore) blobPath(d digest.Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", fmt.Errorf("%s: blob %q: %w: %v", s.root, d, errdef.ErrInvalidDigest, err)
	}
	return s.path(ocispec.ImageBlobsDir, d.Algorithm().String(), d.Encoded()), nil
}

// layoutRes opens directories under a layout's root.
var layoutRes beneath.Resolver

// openDir opens the directory rel (slash-separated) under the layout's root
// without following a symlink on the way: a symlink or a file where a
// directory has to be is an ErrInvalidLayout naming it. With create, missing
// directories are made (mode 0755). The root itself may be a symlink: it is
// the user's choice.
func (s *layoutStore) openDir(rel string, create bool) (int, error) {
	fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: s.root, Err: err}
	}
	if !create {
		sub, err := layoutRes.Open(fd, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
		unix.Close(fd)
		if err != nil {
			return -1, s.dirError(rel, err)
		}
		return sub, nil
	}
	done := ""
	for _, el := range strings.Split(rel, "/") {
		done = path.Join(done, el)
		if err := unix.Mkdirat(fd, el, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, &os.PathError{Op: "mkdir", Path: s.path(done), Err: err}
		}
		next, err := unix.Openat(fd, el, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, s.dirError(done, err)
		}
		fd = next
	}
	return fd, nil
}

// dirError describes err from opening the directory rel of the layout.
func (s *layoutStore) dirError(rel string, err error) error {
	if beneath.Unsafe(err) {
		return fmt.Errorf("%s: %w: a symlink or a file is where a directory has to be (%v)", s.path(rel), ErrInvalidLayout, err)
	}
	return &os.PathError{Op: "open", Path: s.path(rel), Err: err}
}

// blobDir opens the directory of the blobs of algorithm d uses.
func (s *layoutStore) blobDir(d digest.Digest, create bool) (int, error) {
	return s.openDir(path.Join(ocispec.ImageBlobsDir, d.Algorithm().String()), create)
}

// openBlob opens the blob desc, checking it is a regular file of the size
// desc says before anything reads it.
func (s *layoutStore) openBlob(desc ocispec.Descriptor) (*os.File, error) {
	p, err := s.blobPath(desc.Digest)
	if err != nil {
		return nil, err
	}
	if desc.Size < 0 {
		return nil, fmt.Errorf("%s: blob %s: %w: size %d", s.root, desc.Digest, ErrInvalidLayout, desc.Size)
	}
	f, fi, err := openRegular(p, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: blob %s: %w", s.root, desc.Digest, errdef.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: blob %s: %w", s.root, desc.Digest, err)
	}
	if fi.Size() != desc.Size {
		f.Close()
		return nil, fmt.Errorf("%s: blob %s: %w: %d bytes, its descriptor says %d", s.root, desc.Digest, ErrInvalidLayout, fi.Size(), desc.Size)
	}
	return f, nil
}

// Fetch opens the blob desc; it reads at most desc.Size bytes.
func (s *layoutStore) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	f, err := s.openBlob(desc)
	if err != nil {
		return nil, err
	}
	return readCloser{io.LimitReader(f, desc.Size), f}, nil
}

// readCloser reads from one part of a file and closes the file.
type readCloser struct {
	io.Reader
	io.Closer
}

// Exists reports whether the blob desc is stored: a regular file of its
// size, not a symlink, in a directory reached without following one (a
// symlink or a file on the way is an error).
func (s *layoutStore) Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	p, err := s.blobPath(desc.Digest)
	if err != nil {
		return false, err
	}
	dfd, err := s.blobDir(desc.Digest, false)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	err = unix.Fstatat(dfd, desc.Digest.Encoded(), &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, &os.PathError{Op: "lstat", Path: p, Err: err}
	}
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == desc.Size, nil
}

// Push stores a blob, verifying its size and digest, and records a manifest
// in index.json.
func (s *layoutStore) Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	manifest := IsManifest(desc.MediaType)
	if desc.Size < 0 || manifest && desc.Size > MaxManifestBytes {
		return fmt.Errorf("%s: push %s: size %d: %w", s.root, desc.Digest, desc.Size, errdef.ErrSizeExceedsLimit)
	}
	ok, err := s.Exists(ctx, desc)
	if err != nil {
		return err
	}
	if !ok {
		if err := s.ingest(desc, r); err != nil {
			return err
		}
	}
	if !manifest {
		return nil
	}
	return s.write(ctx, func(x *layoutIndex) (bool, error) {
		if _, ok := x.digests[desc.Digest]; ok {
			return false, nil
		}
		d := desc
		d.Annotations = withoutRefName(d.Annotations)
		x.doc.Manifests = append(x.doc.Manifests, d)
		x.index()
		return true, nil
	})
}

// ingest writes the blob desc to a new temporary file in ingest/, verifies
// it and renames it into place, all relative to descriptors of the two
// directories, each reached without following a symlink: a symlink planted
// as ingest/ or blobs/<algorithm>/ is refused, one at the blob's name is
// replaced.
func (s *layoutStore) ingest(desc ocispec.Descriptor, r io.Reader) error {
	if _, err := s.blobPath(desc.Digest); err != nil {
		return err
	}
	wrap := func(err error) error { return fmt.Errorf("%s: push %s: %w", s.root, desc.Digest, err) }
	idir, err := s.openDir(ingestDir, true)
	if err != nil {
		return wrap(err)
	}
	defer unix.Close(idir)
	bdir, err := s.blobDir(desc.Digest, true)
	if err != nil {
		return wrap(err)
	}
	defer unix.Close(bdir)
	f, name, err := createTempAt(idir, desc.Digest.Encoded()+"_", s.path(ingestDir))
	if err != nil {
		return wrap(err)
	}
	vr := verify.Reader(r, "blob", desc)
	_, err = io.Copy(f, vr) // nil only once vr verified every byte
	if err == nil {
		err = f.Chmod(0o444)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = unix.Renameat(idir, name, bdir, desc.Digest.Encoded()); err != nil {
			err = &os.LinkError{Op: "rename", Old: s.path(ingestDir, name), New: s.path(ocispec.ImageBlobsDir, desc.Digest.Algorithm().String(), desc.Digest.Encoded()), Err: err}
		}
	}
	if err != nil {
		_ = unix.Unlinkat(idir, name, 0)
		return wrap(err)
	}
	return nil
}

// createTempAt creates a new file named prefix and random hex in the
// directory dfd (dir, for messages), exclusively and never through a symlink.
func createTempAt(dfd int, prefix, dir string) (*os.File, string, error) {
	for range 10 {
		var rnd [8]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, "", err
		}
		name := prefix + hex.EncodeToString(rnd[:])
		fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return nil, "", &os.PathError{Op: "create", Path: filepath.Join(dir, name), Err: err}
		}
		return os.NewFile(uintptr(fd), filepath.Join(dir, name)), name, nil
	}
	return nil, "", &os.PathError{Op: "create", Path: filepath.Join(dir, prefix+"*"), Err: fs.ErrExist}
}
