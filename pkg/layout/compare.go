package layout

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/internal/beneath"
)

// Difference is one way a directory differs from a version.
type Difference struct {
	Path string `json:"path"`
	// Kind is one of missing, extra, type, size, mode, digest, target.
	Kind string `json:"kind"`
	Want string `json:"want,omitempty"`
	Got  string `json:"got,omitempty"`
}

func (d Difference) String() string {
	switch d.Kind {
	case "missing", "extra":
		return fmt.Sprintf("%s: %s", d.Path, d.Kind)
	}
	return fmt.Sprintf("%s: %s %s, want %s", d.Path, d.Kind, d.Got, d.Want)
}

// CompareDir compares the directory dir with the version v: every entry's
// type and permission bits, every file's size and SHA-256, every symlink's
// target, and entries missing from dir or not in v. Names bdnvol keeps for
// itself (ReservedPrefix) are not compared. It reads dir through directory
// descriptors, each opened from its parent's without following a symlink,
// so a directory swapped for a symlink is never read through, and it
// writes nothing. With sel (nil for all) it compares only the selection a
// partial pull with sel writes (Index.Selection): other entries of v are
// not missing, and entries of dir that sel refuses are not extra.
func CompareDir(ctx context.Context, v *Version, dir string, sel func(path string) bool) ([]Difference, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s: not a directory", dir)
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(root)
	w := &dirComparer{
		dir:  dir,
		want: make(map[string]*File, v.Index.Len()),
		buf:  make([]byte, 1<<20),
		sel:  sel,
	}
	for i, ok := range v.Index.Selection(sel) {
		if ok {
			w.want[v.Index.Path(i)] = v.Index.fileRef(i)
		}
	}
	w.seen = make(map[string]bool, len(w.want))
	if err := w.walk(ctx, root, ""); err != nil {
		return nil, err
	}
	for fi := range v.Index.Len() {
		f := v.Index.File(fi)
		if _, ok := w.want[f.Path]; !ok {
			continue
		}
		if !w.seen[f.Path] && !underMissing(f.Path, w.seen, w.want) {
			w.diffs = append(w.diffs, Difference{Path: f.Path, Kind: "missing"})
		}
	}
	return w.diffs, nil
}

// compareHook, when set (by tests), runs after CompareDir has looked at the
// entry p and before it reads it.
var compareHook func(p string)

// dirComparer is one run of CompareDir.
type dirComparer struct {
	dir   string
	want  map[string]*File
	seen  map[string]bool
	diffs []Difference
	buf   []byte
	sel   func(string) bool // nil: every entry is compared
}

func (w *dirComparer) full(rel string) string { return filepath.Join(w.dir, filepath.FromSlash(rel)) }

// walk compares the entries of the directory dfd (rel under dir) in name
// order, depth first.
func (w *dirComparer) walk(ctx context.Context, dfd int, rel string) error {
	names, err := beneath.Names(dfd, w.full(rel))
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(name, ReservedPrefix) {
			continue
		}
		p := path.Join(rel, name)
		if err := w.entry(ctx, dfd, name, p); err != nil {
			return err
		}
	}
	return nil
}

// entry compares the entry name of the directory dfd, at p under dir.
func (w *dirComparer) entry(ctx context.Context, dfd int, name, p string) error {
	f, ok := w.want[p]
	if !ok && w.sel != nil && !w.sel(p) {
		return nil // outside the selection: not looked at
	}
	if !ok {
		w.diffs = append(w.diffs, Difference{Path: p, Kind: "extra"})
		return nil
	}
	w.seen[p] = true
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "lstat", Path: w.full(p), Err: err}
	}
	got := typeOfStat(&st)
	if got != f.Type {
		w.diffs = append(w.diffs, Difference{Path: p, Kind: "type", Want: f.Type, Got: got})
		return nil
	}
	if perm := uint32(st.Mode) & 0o777; f.Type != TypeSymlink && perm != f.Mode {
		w.diffs = append(w.diffs, Difference{Path: p, Kind: "mode", Want: fmt.Sprintf("%04o", f.Mode), Got: fmt.Sprintf("%04o", perm)})
	}
	if compareHook != nil {
		compareHook(p)
	}
	switch f.Type {
	case TypeSymlink:
		target, err := beneath.Readlink(dfd, name, MaxTargetBytes)
		if err != nil {
			return &os.PathError{Op: "readlink", Path: w.full(p), Err: err}
		}
		if target != f.Target {
			w.diffs = append(w.diffs, Difference{Path: p, Kind: "target", Want: f.Target, Got: target})
		}
	case TypeFile:
		if st.Size != f.Size {
			w.diffs = append(w.diffs, Difference{Path: p, Kind: "size", Want: fmt.Sprint(f.Size), Got: fmt.Sprint(st.Size)})
			return nil
		}
		d, err := fileDigestAt(dfd, name, w.full(p), w.buf)
		if err != nil {
			return err
		}
		if d != f.Digest {
			w.diffs = append(w.diffs, Difference{Path: p, Kind: "digest", Want: f.Digest.String(), Got: d.String()})
		}
	case TypeDir:
		sub, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return swappedError(w.full(p), err)
		}
		defer unix.Close(sub)
		return w.walk(ctx, sub, p)
	}
	return nil
}

// swappedError describes err from opening full, which was just found to be
// a directory or a regular file, without following a symlink.
func swappedError(full string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("%s: %w: replaced by a symlink or another type while verifying (%v)", full, ErrUnsupportedFile, err)
	}
	return &os.PathError{Op: "open", Path: full, Err: err}
}

// underMissing reports whether an ancestor of p is itself reported (missing
// or of the wrong type), so that only the top of a missing subtree is listed.
func underMissing(p string, seen map[string]bool, want map[string]*File) bool {
	for q := parentOf(p); q != ""; q = parentOf(q) {
		if _, ok := want[q]; ok && !seen[q] {
			return true
		}
	}
	return false
}

func typeOfStat(st *unix.Stat_t) string {
	switch {
	case isRegular(st):
		return TypeFile
	case isDir(st):
		return TypeDir
	case isSymlink(st):
		return TypeSymlink
	}
	return "other"
}

// fileDigestAt hashes the regular file name in the directory dfd (full, for
// messages), opened without following a symlink or blocking on a FIFO put
// in its place.
func fileDigestAt(dfd int, name, full string, buf []byte) (digest.Digest, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", swappedError(full, err)
	}
	fh := os.NewFile(uintptr(fd), full)
	defer fh.Close()
	info, err := fh.Stat()
	if err != nil {
		return "", err
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("%s: %w: not a regular file", full, errors.ErrUnsupported)
	}
	h := sha256.New()
	if _, err := io.CopyBuffer(h, fh, buf); err != nil {
		return "", err
	}
	return digest.NewDigest(digest.SHA256, h), nil
}

func isDir(st *unix.Stat_t) bool     { return st.Mode&unix.S_IFMT == unix.S_IFDIR }
func isRegular(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFREG }
func isSymlink(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFLNK }
