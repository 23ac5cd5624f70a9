package push

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// Entry is one file found by Walk.
type Entry struct {
	Path   string // slash-separated, relative to the root
	Type   string // TypeFile, TypeDir or TypeSymlink
	Mode   uint32 // permission bits
	Size   int64
	Target string // symlink target
	Stat   statcache.Key
	// Digest is a regular file's SHA-256 as its source states it (a
	// Hugging Face LFS file's), or "": with Options.Previous it lets
	// the push reuse the chunk list of a file with that digest.
	Digest digest.Digest
}

// Walk lists the tree under root, sorted by path. Symlinks under root are
// not followed (root itself may be one, to a directory); other special
// files are refused with an error naming them. Names bdnvol keeps for its
// own files (ReservedPrefix: a pull's temporary files) are skipped.
func Walk(root string) ([]Entry, error) {
	w, err := walkDir(root)
	if err != nil {
		return nil, err
	}
	return w.entries(), nil
}

// walkDir is Walk, the entries held compactly.
func walkDir(root string) (*walkList, error) {
	st, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s: not a directory", root)
	}
	if lst, err := os.Lstat(root); err == nil && lst.Mode()&fs.ModeSymlink != 0 {
		// filepath.WalkDir would list the link alone.
		if root, err = filepath.EvalSymlinks(root); err != nil {
			return nil, err
		}
	}
	var out walkBuilder
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		if strings.HasPrefix(d.Name(), layout.ReservedPrefix) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.Type().IsRegular() {
			// Stat later, many at once (statFiles).
			if err := layout.CheckPath(rel); err != nil {
				return fmt.Errorf("%s: %w: %v", p, layout.ErrUnsupportedFile, err)
			}
			e := Entry{Path: rel, Type: layout.TypeFile}
			if err := out.add(&e); err != nil {
				return err
			}
			out.w.meta[len(out.w.meta)-1] |= statPending
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := Entry{Path: rel, Mode: uint32(info.Mode().Perm()), Stat: statcache.KeyOf(info)}
		switch m := info.Mode(); {
		case m.IsRegular():
			e.Type, e.Size = layout.TypeFile, info.Size()
		case m.IsDir():
			e.Type = layout.TypeDir
		case m&fs.ModeSymlink != 0:
			e.Type = layout.TypeSymlink
			if e.Target, err = os.Readlink(p); err != nil {
				return err
			}
			if err := layout.CheckSymlink(rel, filepath.ToSlash(e.Target)); err != nil {
				return fmt.Errorf("%s: %w: %v", p, layout.ErrUnsupportedFile, err)
			}
			e.Target = filepath.ToSlash(e.Target)
			e.Mode = 0o777
		default:
			return fmt.Errorf("%s: %w: %s", p, layout.ErrUnsupportedFile, m.Type())
		}
		if err := layout.CheckPath(rel); err != nil {
			return fmt.Errorf("%s: %w: %v", p, layout.ErrUnsupportedFile, err)
		}
		return out.add(&e) // the path is copied: p and rel are not kept
	})
	if err != nil {
		return nil, err
	}
	if err := out.statFiles(root); err != nil {
		return nil, err
	}
	return out.list(), nil
}

// statFiles fills in the mode, size and stat key of the regular files
// added with none, statting statWorkers at a time: on a tree of many small
// files the walk is mostly these calls.
func (b *walkBuilder) statFiles(root string) error {
	w := &b.w
	w.arena = b.arena.String()
	const batch = 4096
	var next atomic.Int64
	g := new(errgroup.Group)
	for range statWorkers {
		g.Go(func() error {
			for {
				lo := int(next.Add(batch)) - batch
				if lo >= w.len() {
					return nil
				}
				for i := lo; i < min(lo+batch, w.len()); i++ {
					if w.meta[i]&statPending == 0 {
						continue // statted in the walk
					}
					p := filepath.Join(root, filepath.FromSlash(w.path(i)))
					info, err := os.Lstat(p)
					if err != nil {
						return err
					}
					if !info.Mode().IsRegular() {
						return fmt.Errorf("%s: %w (no longer a regular file)", p, ErrFileChanged)
					}
					k := statcache.KeyOf(info)
					w.meta[i] = kindFile<<16 | uint32(info.Mode().Perm())
					w.size[i], w.mtime[i], w.ctime[i], w.ino[i] = k.Size, k.Mtime, k.Ctime, k.Ino
				}
			}
		})
	}
	return g.Wait()
}

// statPending marks, in a walkList's meta, a regular file not statted yet.
const statPending = 1 << 15

// statWorkers is how many files statFiles stats at once.
var statWorkers = max(4, 2*runtime.GOMAXPROCS(0))
