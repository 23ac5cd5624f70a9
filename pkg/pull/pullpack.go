package pull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// packBudget bounds the bytes of chunks held in memory at once: a chunk
// packing many small files is fetched whole and verified before any of its
// files is written, so each file is written once, under its temporary
// name, and renamed at once (no temporary waits for the rest of its chunk).
const packBudget = 32 << 20

// packed reports whether the chunk desc with targets ts is fetched whole
// into memory: it holds more than one file and is no larger than the
// default largest chunk.
func packed(desc ocispec.Descriptor, ts []target) bool {
	return len(ts) > 1 && desc.Size <= layout.DefaultParams.Max
}

// fetchWhole fetches the chunk desc into buf (grown as needed), checking
// its size and digest, and returns its bytes.
func fetchWhole(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, buf *[]byte, c *progress.Counters) ([]byte, error) {
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if int64(cap(*buf)) < desc.Size {
		*buf = make([]byte, desc.Size)
	}
	data := (*buf)[:desc.Size]
	var off int
	for off < len(data) {
		n, rerr := rc.Read(data[off:])
		off += n
		c.Sent.Add(int64(n))
		if rerr != nil {
			if off < len(data) {
				if rerr == io.EOF {
					rerr = io.ErrUnexpectedEOF
				}
				return nil, fmt.Errorf("read after %d of %d bytes: %w", off, desc.Size, rerr)
			}
			break
		}
	}
	if verify.CheckedOf(rc).Vouches(desc) {
		return data, nil // verified by a decoder: not hashed again
	}
	h := newChunkHash()
	h.Write(data)
	if err := verify.End("", desc, rc, digest.NewDigest(digest.SHA256, h), int64(len(data))); err != nil {
		return nil, err
	}
	return data, nil
}

// dirFD holds the descriptor of one directory under the destination, the
// one the last file was in: files come in path order, so most files of a
// chunk share their directory with the file before. One with shared set
// takes the descriptor from there, where the jobs writing into one
// directory at once share one (sharedDirs).
type dirFD struct {
	d      *destDir
	shared *sharedDirs
	rel    string
	fd     int // -1 when none is held
	dev    uint64
}

func newDirFD(d *destDir) *dirFD { return &dirFD{d: d, fd: -1} }

// newSharedDirFD returns a dirFD whose descriptors come from s.
func newSharedDirFD(d *destDir, s *sharedDirs) *dirFD { return &dirFD{d: d, shared: s, fd: -1} }

// get returns a descriptor of the directory rel (resolved as openDir does)
// and its device.
func (c *dirFD) get(rel string) (int, uint64, error) {
	if c.fd >= 0 && c.rel == rel {
		return c.fd, c.dev, nil
	}
	c.close()
	if c.shared != nil {
		fd, dev, err := c.shared.acquire(c.d, rel)
		if err != nil {
			return -1, 0, err
		}
		c.fd, c.rel, c.dev = fd, rel, dev
		return fd, dev, nil
	}
	fd, dev, err := openDirDev(c.d, rel)
	if err != nil {
		return -1, 0, err
	}
	c.fd, c.rel, c.dev = fd, rel, dev
	return fd, c.dev, nil
}

func (c *dirFD) close() {
	if c.fd >= 0 {
		if c.shared != nil {
			c.shared.release(c.rel)
		} else {
			unix.Close(c.fd)
		}
		c.fd = -1
	}
}

// openDirDev opens the directory rel under d and returns it with its device.
func openDirDev(d *destDir, rel string) (int, uint64, error) {
	fd, err := d.openDir(rel)
	if err != nil {
		return -1, 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, &os.PathError{Op: "stat", Path: d.full(rel), Err: err}
	}
	return fd, uint64(st.Dev), nil
}

// sharedDirs holds, by path, the directory descriptors the pull's jobs
// use now, each open once however many jobs write into it, and closed
// when the last of them lets it go: packs hold files in path order, so
// the jobs mostly write into the same directory or two, and a pull holds
// one descriptor for them, not one a job.
type sharedDirs struct {
	mu   sync.Mutex
	dirs map[string]*sharedDir
}

type sharedDir struct {
	fd   int
	dev  uint64
	refs int
}

func (s *sharedDirs) acquire(d *destDir, rel string) (int, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.dirs[rel]; ok {
		e.refs++
		return e.fd, e.dev, nil
	}
	fd, dev, err := openDirDev(d, rel)
	if err != nil {
		return -1, 0, err
	}
	if s.dirs == nil {
		s.dirs = map[string]*sharedDir{}
	}
	s.dirs[rel] = &sharedDir{fd: fd, dev: dev, refs: 1}
	return fd, dev, nil
}

func (s *sharedDirs) release(rel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.dirs[rel]; ok {
		if e.refs--; e.refs <= 0 {
			unix.Close(e.fd)
			delete(s.dirs, rel)
		}
	}
}

// writeWhole writes the verified bytes data, all of the file f (an entry
// of x), to its temporary file, sets its mode and renames it into place.
// It reports false, writing nothing, when the
// temporary file already exists (an interrupted pull left it): the caller
// writes through it as for any file.
func (d *destDir) writeWhole(x *layout.Index, pf pullFile, f *layout.File, data []byte, dc *dirFD, opt Options) (bool, error) {
	mu := pf.lock()
	mu.Lock()
	defer mu.Unlock()
	if pf.created() {
		return false, nil
	}
	// Always checked, as the bytes are at hand: the stat cache records
	// the digest as the file's, and a push trusts it.
	if err := verify.Bytes("file "+f.Path, data, ocispec.Descriptor{Digest: f.Digest, Size: f.Size}); err != nil {
		return true, err
	}
	fd, leftover, err := pf.createFD()
	if err != nil {
		return true, err
	}
	defer unix.Close(fd)
	for off := 0; off < len(data); {
		n, err := unix.Pwrite(fd, data[off:], int64(off))
		if err != nil {
			return true, writeError{&os.PathError{Op: "write", Path: pf.tmpPath(), Err: err}}
		}
		off += n
	}
	if leftover { // appeared since the pull looked: it may be longer
		if err := unix.Ftruncate(fd, int64(len(data))); err != nil {
			return true, writeError{&os.PathError{Op: "truncate", Path: pf.tmpPath(), Err: err}}
		}
	}
	pf.setCreated()
	if err := unix.Fchmod(fd, f.Mode); err != nil {
		return true, &os.PathError{Op: "chmod", Path: pf.tmpPath(), Err: err}
	}
	pfd, _, err := dc.get(parentOf(f.Path))
	if err != nil {
		return true, err
	}
	if err := d.renameInto(pf, pfd, f.Path); err != nil {
		return true, err
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil {
		opt.StatCache.StorePulled(x, f.Path, unixStatKey(&st), false, true)
	}
	return true, nil
}

// renameInto renames the temporary file of pf to the final name of rel in
// the directory pfd, checking right before that the temporary name is
// still the file this pull created. An empty directory at the final name
// goes; one with contents is the user's data and an error.
func (d *destDir) renameInto(pf pullFile, pfd int, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(pf.tmp().fd, pf.name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || uint64(st.Dev) != pf.tmp().dev || uint64(st.Ino) != pf.inode() {
		return fmt.Errorf("%s: %w: the temporary file was replaced", pf.tmpPath(), ErrUnsafeDestination)
	}
	base := path.Base(rel)
	if renameNoReplace(pf.tmp().fd, pf.name(), pfd, base) == nil {
		return nil // nothing was at the final name: one syscall
	}
	if st, ok, _ := lstatAt(pfd, base); ok && !isDir(&st) {
		// Something is at the final name: swap it with the temporary file
		// and remove it from there. ext4 flushes a file renamed over
		// another first (auto_da_alloc), which makes an upgrade wait
		// seconds per large file; an exchange replaces as atomically and
		// flushes nothing.
		if err := exchange(pf.tmp().fd, pf.name(), pfd, base); err == nil {
			if err := unix.Unlinkat(pf.tmp().fd, pf.name(), 0); err == nil || errors.Is(err, unix.ENOENT) {
				return nil
			}
			// A directory was put at the final name since it was looked
			// at: swap back, and rename as below.
			if err := exchange(pf.tmp().fd, pf.name(), pfd, base); err != nil {
				return &os.LinkError{Op: "rename", Old: pf.tmpPath(), New: d.full(rel), Err: err}
			}
		}
	}
	err := unix.Renameat(pf.tmp().fd, pf.name(), pfd, base)
	if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		if st, ok, _ := lstatAt(pfd, base); ok && isDir(&st) {
			if err := unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR); err != nil {
				_ = unix.Unlinkat(pf.tmp().fd, pf.name(), 0)
				return fmt.Errorf("%s: a non-empty directory is in the place of a file", d.full(rel))
			}
		}
		err = unix.Renameat(pf.tmp().fd, pf.name(), pfd, base)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: pf.tmpPath(), New: d.full(rel), Err: err}
	}
	return nil
}

// unixStatKey is the stat key of st.
func unixStatKey(st *unix.Stat_t) statcache.Key {
	return statcache.Key{
		Size:  st.Size,
		Mtime: st.Mtim.Sec*1e9 + st.Mtim.Nsec,
		Ctime: st.Ctim.Sec*1e9 + st.Ctim.Nsec,
		Ino:   uint64(st.Ino),
	}
}
