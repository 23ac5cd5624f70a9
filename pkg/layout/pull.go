package layout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"oras.land/oras-go/v2/errdef"
	"os"
	"path/filepath"
	"time"

	"sync"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2/content"
)

// ErrDigestMismatch is wrapped when fetched or written bytes do not match
// their digest.
var ErrDigestMismatch = errors.New("content does not match its digest")

// PullOptions configure Pull. Zero values select defaults.
type PullOptions struct {
	Jobs     int        // concurrent chunk fetches; <= 0 means 8
	Cache    *StatCache // remembers verified files; nil disables it
	Counters *Counters  // progress; may be nil
}

// PullResult describes a pull.
type PullResult struct {
	Files         int   // index entries
	Bytes         int64 // file bytes
	ChunksFetched int64
	BytesFetched  int64
	FilesReused   int // files already present and verified
}

// target is where part of a chunk goes: a range of a file being written.
type target struct {
	file              int // index into Index.Files
	fileOff, chunkOff int64
	n                 int64
}

type pullFile struct {
	final, tmp string
	remaining  atomic.Int64 // bytes not yet written and verified
	tainted    atomic.Bool  // a chunk was re-fetched: hash the file again at the end

	// The file's SHA-256 is computed in file order while chunks arrive in
	// any order: bytes at the hashed offset are hashed as they are written;
	// ranges written ahead of it wait in ahead and are read back from the
	// temporary file once the gap before them closes.
	mu      sync.Mutex
	cond    *sync.Cond
	h       hash.Hash
	hashed  int64
	ahead   map[int64]int64 // start → end of written ranges past hashed
	hashing bool
	err     error
}

func newPullFile(final, tmp string) *pullFile {
	pf := &pullFile{final: final, tmp: tmp, h: sha256.New(), ahead: map[int64]int64{}}
	pf.cond = sync.NewCond(&pf.mu)
	return pf
}

// wrote records that data now sits at off in the temporary file.
func (pf *pullFile) wrote(off int64, data []byte) {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	if off != pf.hashed || pf.hashing {
		pf.ahead[off] = off + int64(len(data))
		if !pf.hashing {
			pf.catchUp()
		}
		return
	}
	pf.hashing = true
	pf.mu.Unlock()
	pf.h.Write(data)
	pf.mu.Lock()
	pf.hashed += int64(len(data))
	pf.hashing = false
	pf.catchUp()
}

// catchUp hashes the ranges written ahead that now follow the hashed
// prefix, reading them back. Called with mu held and hashing false.
func (pf *pullFile) catchUp() {
	pf.hashing = true
	for pf.err == nil {
		end, ok := pf.ahead[pf.hashed]
		if !ok {
			break
		}
		delete(pf.ahead, pf.hashed)
		start := pf.hashed
		pf.mu.Unlock()
		err := hashRange(pf.h, pf.tmp, start, end)
		pf.mu.Lock()
		pf.hashed, pf.err = end, err
	}
	pf.hashing = false
	pf.cond.Broadcast()
}

// sum waits until size bytes are hashed and returns the digest.
func (pf *pullFile) sum(size int64) (digest.Digest, error) {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	for pf.err == nil && (pf.hashing || pf.hashed < size) {
		if !pf.hashing {
			if _, ok := pf.ahead[pf.hashed]; !ok {
				return "", fmt.Errorf("internal error: %d of %d bytes hashed", pf.hashed, size)
			}
			pf.catchUp()
			continue
		}
		pf.cond.Wait()
	}
	if pf.err != nil {
		return "", pf.err
	}
	return digest.NewDigest(digest.SHA256, pf.h), nil
}

func hashRange(h hash.Hash, path string, start, end int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(h, io.NewSectionReader(f, start, end-start))
	if err == nil && n != end-start {
		err = fmt.Errorf("%s: short read at %d", path, start+n)
	}
	return err
}

// Pull materialises the version v under dir. Files are written under a
// temporary name, verified against their SHA-256 and renamed into place;
// nothing is written outside dir. A re-run after an interruption fetches
// only the chunks that are missing.
func Pull(ctx context.Context, src content.Fetcher, v *Version, dir string, opt PullOptions) (*PullResult, error) {
	if opt.Jobs <= 0 {
		opt.Jobs = 8
	}
	if opt.Counters == nil {
		opt.Counters = &Counters{}
	}
	x := v.Index
	res := &PullResult{Files: len(x.Files), Bytes: x.Bytes()}
	opt.Counters.Total.Store(res.Bytes)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	join := func(p string) string { return filepath.Join(dir, filepath.FromSlash(p)) }

	// Directories first (parents sort before children), writable while we fill them.
	for _, f := range x.Files {
		if f.Type == TypeDir {
			if err := ensureDir(join(f.Path)); err != nil {
				return nil, err
			}
		}
	}
	files := make([]*pullFile, len(x.Files))
	byChunk := make([][]target, len(x.Chunks))
	var ready []int
	for i := range x.Files {
		f := &x.Files[i]
		if f.Type != TypeFile {
			continue
		}
		final := join(f.Path)
		if st, err := os.Lstat(final); err == nil && st.Mode().IsRegular() && st.Size() == f.Size {
			if ok, err := verifyExisting(final, f, st, opt.Cache); err == nil && ok {
				if err := os.Chmod(final, os.FileMode(f.Mode)); err != nil {
					return nil, err
				}
				res.FilesReused++
				opt.Counters.Processed.Add(f.Size)
				continue
			}
		}
		h := sha256.Sum256([]byte(f.Path))
		pf := newPullFile(final, filepath.Join(filepath.Dir(final), ".bdnvol-"+hex.EncodeToString(h[:8])+".part"))
		files[i] = pf
		done, err := prepareTmp(pf.tmp, f, x, v.Chunks)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
		var off, remaining int64
		for k, e := range f.Extents {
			if !done[k] {
				byChunk[e.Chunk] = append(byChunk[e.Chunk], target{file: i, fileOff: off, chunkOff: e.Offset, n: e.Length})
				remaining += e.Length
			} else {
				pf.ahead[off] = off + e.Length // verified by a previous pull
				opt.Counters.Processed.Add(e.Length)
			}
			off += e.Length
		}
		pf.remaining.Store(remaining)
		if remaining == 0 {
			ready = append(ready, i)
		}
	}
	for _, i := range ready {
		if err := finishFile(&x.Files[i], files[i], opt.Cache); err != nil {
			return nil, err
		}
	}

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opt.Jobs)
	bufs := sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}
	var fetchedChunks, fetchedBytes atomic.Int64
	for k, ts := range byChunk {
		if len(ts) == 0 {
			continue
		}
		desc := v.Chunks[k]
		g.Go(func() error {
			buf := bufs.Get().(*[]byte)
			defer bufs.Put(buf)
			var err error
			for attempt := 1; ; attempt++ {
				err = streamChunk(gctx, src, desc, ts, files, *buf, opt.Counters)
				if err == nil || attempt >= fetchAttempts || !refetchable(gctx, err) {
					break
				}
				// The bytes written so far may be wrong and may have gone
				// into the files' running hashes: re-hash those files whole.
				for _, t := range ts {
					files[t.file].tainted.Store(true)
				}
				select {
				case <-gctx.Done():
				case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
				}
			}
			if err != nil {
				return fmt.Errorf("chunk %s (for %s): %w", desc.Digest, x.Files[ts[0].file].Path, err)
			}
			fetchedChunks.Add(1)
			fetchedBytes.Add(desc.Size)
			for _, t := range ts {
				if files[t.file].remaining.Add(-t.n) == 0 {
					if err := finishFile(&x.Files[t.file], files[t.file], opt.Cache); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res.ChunksFetched, res.BytesFetched = fetchedChunks.Load(), fetchedBytes.Load()

	for _, f := range x.Files {
		if f.Type == TypeSymlink {
			if err := ensureSymlink(join(f.Path), filepath.FromSlash(f.Target)); err != nil {
				return nil, err
			}
		}
	}
	for i := len(x.Files) - 1; i >= 0; i-- {
		if f := x.Files[i]; f.Type == TypeDir {
			if err := os.Chmod(join(f.Path), os.FileMode(f.Mode)); err != nil {
				return nil, err
			}
		}
	}
	if err := opt.Cache.Save(); err != nil {
		return nil, fmt.Errorf("save stat cache: %w", err)
	}
	return res, nil
}

// fetchAttempts bounds the fetches of one chunk: a body cut short or
// corrupted in transit is fetched again.
const fetchAttempts = 3

// writeError marks a failure to write the local file, which a re-fetch
// does not cure.
type writeError struct{ error }

func (e writeError) Unwrap() error { return e.error }

// refetchable reports whether fetching a chunk again may succeed.
func refetchable(ctx context.Context, err error) bool {
	var we writeError
	return ctx.Err() == nil && !errors.As(err, &we) && !errors.Is(err, errdef.ErrNotFound)
}

// streamChunk fetches one chunk and writes it to its targets as it
// arrives, verifying its size and digest. The targets' files are not
// renamed into place unless this returns nil, so unverified bytes are never
// visible under a final name.
func streamChunk(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, ts []target, files []*pullFile, buf []byte, c *Counters) error {
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		return err
	}
	defer rc.Close()
	open := make(map[int]*os.File, len(ts))
	defer func() {
		for _, f := range open {
			f.Close()
		}
	}()
	h := sha256.New()
	var off int64
	for off < desc.Size {
		n, rerr := io.ReadFull(rc, buf[:min(int64(len(buf)), desc.Size-off)])
		if n > 0 {
			block := buf[:n]
			h.Write(block)
			for _, t := range ts {
				lo, hi := max(off, t.chunkOff), min(off+int64(n), t.chunkOff+t.n)
				if lo >= hi {
					continue
				}
				f := open[t.file]
				if f == nil {
					if f, err = os.OpenFile(files[t.file].tmp, os.O_WRONLY, 0); err != nil {
						return writeError{err}
					}
					open[t.file] = f
				}
				if _, err := f.WriteAt(block[lo-off:hi-off], t.fileOff+lo-t.chunkOff); err != nil {
					return writeError{err}
				}
				files[t.file].wrote(t.fileOff+lo-t.chunkOff, block[lo-off:hi-off])
			}
			off += int64(n)
			c.Sent.Add(int64(n))
			c.Processed.Add(int64(n))
		}
		if rerr != nil {
			if off < desc.Size {
				return fmt.Errorf("read after %d of %d bytes: %w", off, desc.Size, rerr)
			}
			break
		}
	}
	var one [1]byte
	if n, _ := rc.Read(one[:]); n > 0 {
		return fmt.Errorf("%w: more than %d bytes", ErrDigestMismatch, desc.Size)
	}
	if got := digest.NewDigest(digest.SHA256, h); got != desc.Digest {
		return fmt.Errorf("%w: got %s", ErrDigestMismatch, got)
	}
	for _, f := range open {
		if err := f.Close(); err != nil {
			return writeError{err}
		}
	}
	clear(open)
	return nil
}

// ensureDir makes p a real, writable directory, replacing any file or
// symlink in its place.
func ensureDir(p string) error {
	st, err := os.Lstat(p)
	switch {
	case err == nil && st.IsDir():
		if st.Mode().Perm()&0o700 != 0o700 {
			return os.Chmod(p, st.Mode().Perm()|0o700)
		}
		return nil
	case err == nil:
		if err := os.Remove(p); err != nil {
			return err
		}
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	return os.Mkdir(p, 0o755)
}

func ensureSymlink(p, target string) error {
	if st, err := os.Lstat(p); err == nil {
		if st.Mode()&os.ModeSymlink != 0 {
			if cur, err := os.Readlink(p); err == nil && cur == target {
				return nil
			}
		}
		if st.IsDir() {
			return fmt.Errorf("%s: a directory is in the place of a symlink", p)
		}
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	return os.Symlink(target, p)
}

// verifyExisting reports whether the file at p already holds f's content.
func verifyExisting(p string, f *File, st os.FileInfo, cache *StatCache) (bool, error) {
	key := statKey(st)
	if c, ok := cache.lookup(f.Path, key); ok {
		return c.Digest == f.Digest, nil
	}
	d, err := fileDigest(p)
	if err != nil {
		return false, err
	}
	if d == f.Digest {
		cache.store(f.Path, cachedFile{Stat: key, Digest: d})
	}
	return d == f.Digest, nil
}

func fileDigest(p string) (digest.Digest, error) {
	fh, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return "", err
	}
	return digest.NewDigest(digest.SHA256, h), nil
}

// prepareTmp creates the temporary file of f, or reuses one left by an
// interrupted pull: extents that cover a whole chunk and already hold its
// bytes are reported done.
func prepareTmp(tmp string, f *File, x *Index, chunks []ocispec.Descriptor) ([]bool, error) {
	done := make([]bool, len(f.Extents))
	fh, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() == f.Size && f.Size > 0 {
		var off int64
		var buf []byte
		for k, e := range f.Extents {
			c := x.Chunks[e.Chunk]
			if e.Offset == 0 && e.Length == c.Size {
				if int64(cap(buf)) < e.Length {
					buf = make([]byte, e.Length)
				}
				b := buf[:e.Length]
				if _, err := fh.ReadAt(b, off); err == nil && digest.FromBytes(b) == c.Digest {
					done[k] = true
				}
			}
			off += e.Length
		}
		return done, nil
	}
	return done, fh.Truncate(f.Size)
}

// finishFile checks the file's SHA-256 (hashed while it was written), sets
// its mode and renames it into place. A file that does not match is removed.
func finishFile(f *File, pf *pullFile, cache *StatCache) error {
	var d digest.Digest
	var err error
	if pf.tainted.Load() {
		d, err = fileDigest(pf.tmp)
	} else {
		d, err = pf.sum(f.Size)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	if d != f.Digest {
		os.Remove(pf.tmp)
		return fmt.Errorf("%s: %w: got %s, want %s", f.Path, ErrDigestMismatch, d, f.Digest)
	}
	if err := os.Chmod(pf.tmp, os.FileMode(f.Mode)); err != nil {
		return err
	}
	if st, err := os.Lstat(pf.final); err == nil && st.IsDir() {
		// An empty directory goes; one with contents is the user's data.
		if err := os.Remove(pf.final); err != nil {
			os.Remove(pf.tmp)
			return fmt.Errorf("%s: a non-empty directory is in the place of a file", pf.final)
		}
	}
	if err := os.Rename(pf.tmp, pf.final); err != nil {
		return err
	}
	if st, err := os.Lstat(pf.final); err == nil {
		cache.store(f.Path, cachedFile{Stat: statKey(st), Digest: d})
	}
	return nil
}
