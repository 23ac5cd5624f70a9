package layout

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
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

// VerifyDir compares the directory dir with the version v: every entry's
// type and permission bits, every file's size and SHA-256, every symlink's
// target, and entries missing from dir or not in v. Names bdnvol keeps for
// itself (ReservedPrefix) are not compared. It reads dir without following
// symlinks and writes nothing.
func VerifyDir(ctx context.Context, v *Version, dir string) ([]Difference, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s: not a directory", dir)
	}
	var diffs []Difference
	want := make(map[string]*File, v.Index.Len())
	for i := range v.Index.Len() {
		want[v.Index.Path(i)] = v.Index.fileRef(i)
	}
	seen := make(map[string]bool, len(want))
	buf := make([]byte, 1<<20)
	err = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(path.Base(rel), ReservedPrefix) {
			if de.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		f, ok := want[rel]
		if !ok {
			diffs = append(diffs, Difference{Path: rel, Kind: "extra"})
			if de.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		seen[rel] = true
		info, err := de.Info()
		if err != nil {
			return err
		}
		got := typeOf(info.Mode())
		if got != f.Type {
			diffs = append(diffs, Difference{Path: rel, Kind: "type", Want: f.Type, Got: got})
			if de.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if f.Type != TypeSymlink && uint32(info.Mode().Perm()) != f.Mode {
			diffs = append(diffs, Difference{Path: rel, Kind: "mode", Want: fmt.Sprintf("%04o", f.Mode), Got: fmt.Sprintf("%04o", uint32(info.Mode().Perm()))})
		}
		switch f.Type {
		case TypeSymlink:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if target != f.Target {
				diffs = append(diffs, Difference{Path: rel, Kind: "target", Want: f.Target, Got: target})
			}
		case TypeFile:
			if info.Size() != f.Size {
				diffs = append(diffs, Difference{Path: rel, Kind: "size", Want: fmt.Sprint(f.Size), Got: fmt.Sprint(info.Size())})
				return nil
			}
			d, err := fileDigest(p, buf)
			if err != nil {
				return err
			}
			if d != f.Digest {
				diffs = append(diffs, Difference{Path: rel, Kind: "digest", Want: f.Digest.String(), Got: d.String()})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for fi := range v.Index.Len() {
		f := v.Index.File(fi)
		if !seen[f.Path] && !underMissing(f.Path, seen, want) {
			diffs = append(diffs, Difference{Path: f.Path, Kind: "missing"})
		}
	}
	return diffs, nil
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

func typeOf(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return TypeFile
	case m.IsDir():
		return TypeDir
	case m&fs.ModeSymlink != 0:
		return TypeSymlink
	}
	return "other"
}

// fileDigest hashes the regular file p, opened without following a symlink
// or blocking on a FIFO put in its place.
func fileDigest(p string, buf []byte) (digest.Digest, error) {
	fh, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	info, err := fh.Stat()
	if err != nil {
		return "", err
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("%s: %w: not a regular file", p, errors.ErrUnsupported)
	}
	h := sha256.New()
	if _, err := io.CopyBuffer(h, fh, buf); err != nil {
		return "", err
	}
	return digest.NewDigest(digest.SHA256, h), nil
}
