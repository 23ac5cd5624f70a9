package pull

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// tmpName is the name of the temporary file of the entry p in a pull's
// private directory: the same on every run, so a re-run finds it.
func tmpName(p string) string {
	h := sha256.Sum256([]byte(p))
	return hex.EncodeToString(h[:16]) + ".part"
}

// name is the temporary file's name in its directory.
func (pf pullFile) name() string { return tmpName(pf.path()) }

// tmpPath is the temporary file's path, for messages.
func (pf pullFile) tmpPath() string { return filepath.Join(pf.tmp().full, pf.name()) }

// open opens the temporary file again, by name in the private directory,
// and checks it is still the file this pull created.
func (pf pullFile) open(flags int) (*os.File, error) {
	fd, err := unix.Openat(pf.tmp().fd, pf.name(), flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: pf.tmpPath(), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: pf.tmpPath(), Err: err}
	}
	if uint64(st.Dev) != pf.tmp().dev || uint64(st.Ino) != pf.inode() {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w: the temporary file was replaced", pf.tmpPath(), ErrUnsafeDestination)
	}
	return os.NewFile(uintptr(fd), pf.tmpPath()), nil
}

// openWrite opens the temporary file for writing, creating it (empty, of
// the entry's size) on first use.
func (pf pullFile) openWrite() (*os.File, error) {
	mu := pf.lock()
	mu.Lock()
	defer mu.Unlock()
	if pf.created() {
		return pf.open(unix.O_WRONLY)
	}
	fh, leftover, err := pf.create()
	if err != nil {
		return nil, err
	}
	if leftover { // appeared since the pull looked: start it anew
		err = fh.Truncate(0)
	}
	if err == nil {
		err = fh.Truncate(pf.size())
	}
	if err != nil {
		fh.Close()
		return nil, err
	}
	pf.setCreated()
	return fh, nil
}

// emptyDigest is the SHA-256 of no bytes.
var emptyDigest = digest.FromBytes(nil)

// digestKnown checks the file's SHA-256 where the index alone tells what it
// must be, with no byte read: an empty file, or one whole chunk (whose
// digest is the file's). Other files' digests are checked on request.
func digestKnown(f *layout.File, x *layout.Index) error {
	want := derivedDigest(f, x)
	if want == "" {
		return nil
	}
	return verify.Digest("file "+f.Path+" in the index", ocispec.Descriptor{Digest: f.Digest, Size: f.Size}, want, f.Size)
}

// derivedDigest returns the SHA-256 of the file where its chunks' digests
// give it (an empty file, or one whole chunk), or "".
func derivedDigest(f *layout.File, x *layout.Index) digest.Digest {
	switch {
	case f.Size == 0:
		return emptyDigest
	case len(f.Extents) == 1:
		if e := f.Extents[0]; e.Offset == 0 && e.Length == x.ChunkSize(e.Chunk) {
			return x.ChunkDigest(e.Chunk)
		}
	}
	return ""
}

// prepareFile looks at what is at the final name of the regular file f. If
// it already holds f's bytes, has no other link, its mode is set (through a
// descriptor) and prepareFile returns a zero pullFile. Otherwise it creates
// the temporary file, or reuses one left by an interrupted pull, and
// reports which extents it already holds. Bytes at the final name that
// match but have other links are copied, not modified in place. dc holds
// the parent directory's descriptor; fresh says that directory was made by
// this pull, so nothing is at the final name to look at. f is entry i of
// x; the file to write is added to files (a zero pullFile: nothing to write).
func (d *destDir) prepareFile(ctx context.Context, f *layout.File, x *layout.Index, cache *statcache.Cache, buf []byte, dc *dirFD, fresh bool, files *pullSet, i int) (pullFile, []bool, error) {
	parent := parentOf(f.Path)
	pfd, dev, err := dc.get(parent)
	if err != nil {
		return pullFile{}, nil, err
	}
	var existing *os.File
	var verified bool
	if !fresh {
		if existing, verified, err = d.matchingFile(pfd, f, x, cache); err != nil {
			return pullFile{}, nil, err
		}
	}
	if existing != nil {
		defer existing.Close()
		info, err := existing.Stat()
		if err != nil {
			return pullFile{}, nil, err
		}
		if nlink(info) == 1 {
			if uint32(info.Mode().Perm()) != f.Mode {
				if err := existing.Chmod(os.FileMode(f.Mode)); err != nil {
					return pullFile{}, nil, err
				}
				if info, err = existing.Stat(); err != nil {
					return pullFile{}, nil, err
				}
			}
			cache.StorePulled(x, f.Path, statcache.KeyOf(info), true, verified)
			return pullFile{}, nil, nil
		}
	}
	tmp, err := d.tmpFor(pfd, dev, parent)
	if err != nil {
		return pullFile{}, nil, err
	}
	pf := files.add(i, tmp, verified)
	done := make([]bool, len(f.Extents))
	if existing == nil && f.Size > 0 && !tmp.names[pf.name()] {
		// The temporary file is created when the first chunk arrives,
		// unless an interrupted pull left one to look at.
		return pf, done, nil
	}
	fh, leftover, err := pf.create()
	if err != nil {
		return pullFile{}, nil, err
	}
	defer fh.Close()
	pf.setCreated()
	switch {
	case existing != nil:
		// Hard-linked elsewhere: copy the verified bytes into a new file.
		if err := fh.Truncate(0); err != nil {
			return pullFile{}, nil, err
		}
		if _, err := io.CopyBuffer(fh, io.NewSectionReader(existing, 0, f.Size), buf); err != nil {
			return pullFile{}, nil, err
		}
		for k := range done {
			done[k] = true
		}
	case leftover:
		info, err := fh.Stat()
		if err != nil {
			return pullFile{}, nil, err
		}
		if info.Size() == f.Size && f.Size > 0 {
			done, _ = leftoverExtents(ctx, fh, f, x, buf)
			return pf, done, nil
		}
		fallthrough
	default:
		if err := fh.Truncate(0); err != nil {
			return pullFile{}, nil, err
		}
		if err := fh.Truncate(f.Size); err != nil {
			return pullFile{}, nil, err
		}
	}
	return pf, done, nil
}

// matchingFile returns the file at f's final name, open, if it is a
// regular file that holds f's bytes; else nil. It never follows a symlink.
// It reports whether the bytes were checked against f's digest (by it or by
// the pull the cache vouches for), not only known to be f's chunks.
func (d *destDir) matchingFile(pfd int, f *layout.File, x *layout.Index, cache *statcache.Cache) (*os.File, bool, error) {
	base := path.Base(f.Path)
	st, ok, err := lstatAt(pfd, base)
	if err != nil {
		return nil, false, &os.PathError{Op: "lstat", Path: d.full(f.Path), Err: err}
	}
	if !ok || !isRegular(&st) || st.Size != f.Size {
		return nil, false, nil
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, nil // replaced, or not readable: write it anew
	}
	fh := os.NewFile(uintptr(fd), d.full(f.Path))
	info, err := fh.Stat()
	if err != nil || !info.Mode().IsRegular() || info.Size() != f.Size {
		fh.Close()
		return nil, false, nil
	}
	key := statcache.KeyOf(info)
	if c, ok := cache.Lookup(f.Path, key); ok {
		if c.Digest == f.Digest {
			return fh, true, nil
		}
		fh.Close()
		return nil, false, nil
	}
	if cache.SameExtents(f.Path, key, f, x) {
		// Written from the same chunks: f's bytes, whatever its digest
		// claims, which stays unchecked.
		return fh, derivedDigest(f, x) != "", nil
	}
	if cache.RecordedOther(f.Path, key, f.Digest) {
		// An earlier pull wrote it, from other chunks, as a file with
		// another digest (a fine-tune keeps sizes): hashing it would read
		// it whole to find it differs. Were that digest a lie and the
		// bytes f's, writing them anew from chunks costs no more.
		fh.Close()
		return nil, false, nil
	}
	if holeIn(fh, 0, f.Size) {
		// A pull writes every byte of a file; a sparse one was planted or
		// copied sparse. Hashing it would read its declared size (of
		// zeros, for the holes) for nothing: it is rewritten instead.
		fh.Close()
		return nil, false, nil
	}
	d.filesHashed.Add(1)
	got, err := readerDigest(io.NewSectionReader(fh, 0, f.Size))
	if err != nil || verify.Digest(f.Path, ocispec.Descriptor{Digest: f.Digest, Size: f.Size}, got, f.Size) != nil {
		fh.Close()
		return nil, false, nil
	}
	return fh, true, nil
}

func nlink(info os.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}

// create creates the temporary file exclusively. One left by an
// interrupted pull is reused (leftover is true) only if it is a regular
// file with one link, owned by this user; anything else at its name is
// removed first (never followed).
func (pf pullFile) create() (fh *os.File, leftover bool, err error) {
	fd, leftover, err := pf.createFD()
	if err != nil {
		return nil, false, err
	}
	return os.NewFile(uintptr(fd), pf.tmpPath()), leftover, nil
}

// createFD is create, returning the descriptor.
func (pf pullFile) createFD() (fd int, leftover bool, err error) {
	const create = unix.O_RDWR | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err = unix.Openat(pf.tmp().fd, pf.name(), create, 0o600)
	if errors.Is(err, unix.EEXIST) {
		fd, err = unix.Openat(pf.tmp().fd, pf.name(), unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && isRegular(&st) && st.Nlink == 1 && int(st.Uid) == os.Geteuid() {
				leftover = true
			} else {
				unix.Close(fd)
			}
		}
		if !leftover {
			if err := unix.Unlinkat(pf.tmp().fd, pf.name(), 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return -1, false, &os.PathError{Op: "remove", Path: pf.tmpPath(), Err: err}
			}
			fd, err = unix.Openat(pf.tmp().fd, pf.name(), create, 0o600)
		}
	}
	if err != nil {
		return -1, false, &os.PathError{Op: "create", Path: pf.tmpPath(), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, false, &os.PathError{Op: "stat", Path: pf.tmpPath(), Err: err}
	}
	if uint64(st.Dev) != pf.tmp().dev {
		unix.Close(fd)
		return -1, false, fmt.Errorf("%s: %w: the temporary file is on another device than its directory", pf.tmpPath(), ErrUnsafeDestination)
	}
	pf.setInode(uint64(st.Ino))
	return fd, leftover, nil
}

// leftoverExtents reports which extents of f the temporary file fh, of
// f.Size bytes and left by an interrupted pull, already holds: extents that
// cover a whole chunk and hold its bytes. Holes are never read (a hole was
// never written); data is hashed as a stream through buf. read is the
// number of bytes read.
func leftoverExtents(ctx context.Context, fh *os.File, f *layout.File, x *layout.Index, buf []byte) (done []bool, read int64) {
	done = make([]bool, len(f.Extents))
	sc, err := fh.SyscallConn()
	if err != nil {
		return done, 0
	}
	// holeAt returns where the next hole at or after off starts (the end of
	// the file if there is none, or if the file system cannot tell).
	holeAt := func(off int64) int64 {
		end := f.Size
		_ = sc.Control(func(fd uintptr) {
			if n, err := unix.Seek(int(fd), off, unix.SEEK_HOLE); err == nil {
				end = n
			}
		})
		return end
	}
	dataAt := func(off int64) int64 {
		next := off
		_ = sc.Control(func(fd uintptr) {
			if n, err := unix.Seek(int(fd), off, unix.SEEK_DATA); err == nil {
				next = n
			} else if errors.Is(err, unix.ENXIO) {
				next = f.Size // only a hole from off to the end
			}
		})
		return next
	}
	var off, hole, data int64 // [data, hole) is the data run around off, once known
	hole = -1
	for k, e := range f.Extents {
		start, end := off, off+e.Length
		off = end
		if e.Offset != 0 || e.Length != x.ChunkSize(e.Chunk) || ctx.Err() != nil {
			continue // a cancelled pull returns from its plan
		}
		if start >= hole {
			data = dataAt(start)
			hole = f.Size
			if data < f.Size {
				hole = holeAt(data)
			}
		}
		if start < data || end > hole {
			continue // partly a hole: never written whole
		}
		h := sha256.New()
		n, err := io.CopyBuffer(h, io.NewSectionReader(fh, start, e.Length), buf)
		read += n
		if err == nil && verify.Digest("chunk", x.ChunkDescriptor(e.Chunk), digest.NewDigest(digest.SHA256, h), n) == nil {
			done[k] = true
		}
	}
	return done, read
}

// holeIn reports whether the file fh has a hole (a range never written,
// which reads as zeros without being stored) in [off, off+n), asking the
// file system with SEEK_HOLE and reading nothing. Where the file system
// cannot tell, it reports false. It moves the file offset: callers read
// with ReadAt.
func holeIn(fh *os.File, off, n int64) bool {
	if n <= 0 {
		return false
	}
	sc, err := fh.SyscallConn()
	if err != nil {
		return false
	}
	hole := false
	_ = sc.Control(func(fd uintptr) {
		if h, err := unix.Seek(int(fd), off, unix.SEEK_HOLE); err == nil {
			hole = h < off+n
		}
	})
	return hole
}

// finishFile sets the mode of a file whose chunks are all written and
// verified (with opt.VerifyFiles, after checking its SHA-256 too) and
// renames it into place, checking right before that the name is still the
// file it wrote. A file that does not match is removed.
func (d *destDir) finishFile(f *layout.File, x *layout.Index, pf pullFile, opt Options) error {
	if f.Size == 0 {
		fh, err := pf.openWrite() // no chunk made it: create it now
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		fh.Close()
	}
	fh, err := pf.open(unix.O_RDONLY)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	defer fh.Close()
	if opt.VerifyFiles {
		got, err := readerDigest(io.NewSectionReader(fh, 0, f.Size))
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		if err := verify.Digest("file "+f.Path, ocispec.Descriptor{Digest: f.Digest, Size: f.Size}, got, f.Size); err != nil {
			_ = unix.Unlinkat(pf.tmp().fd, pf.name(), 0)
			return err
		}
	}
	if err := fh.Chmod(os.FileMode(f.Mode)); err != nil {
		return err
	}
	pfd, err := d.openDir(parentOf(f.Path))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := d.renameInto(pf, pfd, f.Path); err != nil {
		return err
	}
	if info, err := fh.Stat(); err == nil {
		// Every byte came from a verified chunk (or a verified leftover);
		// the file's digest is checked only if asked for or implied.
		verified := opt.VerifyFiles || pf.verified() || derivedDigest(f, x) != ""
		opt.StatCache.StorePulled(x, f.Path, statcache.KeyOf(info), true, verified)
	}
	return nil
}

func readerDigest(r io.Reader) (digest.Digest, error) {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	return digest.NewDigest(digest.SHA256, h), nil
}
