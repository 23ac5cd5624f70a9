package push

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/progress"
)

// uploader stores chunks concurrently, each distinct digest once, skipping
// those the destination already has.
type uploader struct {
	dst      content.Storage
	src      Source
	buffer   *semaphore.Weighted // releases the bytes of buffered jobs
	counters *progress.Counters
	mu       sync.Mutex
	seen     map[digest.Digest]bool
	stored   map[digest.Digest]bool // chunks known to be stored: not asked for
	chunks   atomic.Int64
	bytes    atomic.Int64
	delta    *deltaBase // where chunks may be stored as deltas; nil: none
}

// run calls produce with a submit function and uploads what it submits
// with the given concurrency; it returns when everything is stored.
func (u *uploader) run(ctx context.Context, jobs int, produce func(context.Context, func(chunkJob) error) error) error {
	g, ctx := errgroup.WithContext(ctx)
	queue := make(chan chunkJob, 4*jobs)
	for range jobs {
		g.Go(func() error {
			for j := range queue {
				if err := u.store(ctx, j); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer close(queue)
		return produce(ctx, func(j chunkJob) error {
			u.mu.Lock()
			dup := u.seen[j.Digest] || u.stored[j.Digest]
			u.seen[j.Digest] = true
			u.mu.Unlock()
			if dup {
				u.release(j)
				return nil
			}
			select {
			case queue <- j:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	})
	return g.Wait()
}

// release frees the memory a buffered job holds.
func (u *uploader) release(j chunkJob) {
	switch {
	case j.data == nil:
	case j.held != nil:
		j.held.Release(min(j.Size, bufferBudget))
	case u.buffer != nil:
		u.buffer.Release(min(j.Size, bufferBudget))
	}
}

func (u *uploader) store(ctx context.Context, j chunkJob) error {
	defer u.release(j)
	desc := j.Chunk.Descriptor()
	ok, err := u.dst.Exists(ctx, desc)
	if err != nil {
		return fmt.Errorf("chunk %s: %w", j.Digest, err)
	}
	if ok {
		return nil
	}
	if u.delta != nil {
		if ok, err := u.delta.tryDelta(ctx, u, j); err != nil || ok {
			return err
		}
	}
	var ra io.ReaderAt
	sa := &sectionsAt{src: u.src, secs: j.src}
	defer sa.Close()
	body := &uploadBody{sent: &u.counters.Sent}
	if j.data != nil {
		ra = bytes.NewReader(j.data)
	} else {
		ra, body.sa = sa, sa
	}
	// An io.ReaderAt body lets the transport retry, resume and start the
	// upload over; the layout does not retry on top of it.
	body.SectionReader = io.NewSectionReader(countingReaderAt{ra, &u.counters.Sent}, 0, j.Size)
	err = u.dst.Push(ctx, desc, body)
	if err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
		if serr := sa.failure(); serr != nil {
			return fmt.Errorf("chunk %s: %w", j.Digest, serr)
		}
		return fmt.Errorf("upload chunk %s: %w", j.Digest, err)
	}
	if err == nil {
		u.chunks.Add(1)
		u.bytes.Add(j.Size)
	}
	return nil
}

// sectionsAt reads a list of source file sections as one run of bytes,
// opening the file under each read and keeping the last one open.
type sectionsAt struct {
	src  Source
	secs []section

	mu   sync.Mutex
	cur  int // index of the open section, -1 when none
	f    ReadAtCloser
	err  error
	offs []int64 // start of each section in the run
}

// ReadAt reads the run at off.
func (s *sectionsAt) ReadAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.offs == nil {
		s.cur = -1
		var o int64
		for _, sec := range s.secs {
			s.offs = append(s.offs, o)
			o += sec.n
		}
	}
	done := 0
	for done < len(p) {
		at := off + int64(done)
		i := sort.Search(len(s.offs), func(i int) bool { return s.offs[i] > at }) - 1
		if i < 0 || at >= s.offs[i]+s.secs[i].n {
			return done, io.EOF
		}
		if i != s.cur {
			if s.f != nil {
				s.f.Close()
				s.f = nil
			}
			f, err := s.src.Open(context.Background(), s.secs[i].path)
			if err != nil {
				s.err = err
				return done, err
			}
			s.f, s.cur = f, i
		}
		sec := s.secs[i]
		within := at - s.offs[i]
		n := min(int64(len(p)-done), sec.n-within)
		k, err := s.f.ReadAt(p[done:done+int(n)], sec.off+within)
		done += k
		if err != nil && !(err == io.EOF && int64(k) == n) {
			if err == io.EOF {
				err = fmt.Errorf("%s: %w", sec.path, ErrFileChanged)
			}
			s.err = err
			return done, err
		}
	}
	return done, nil
}

func (s *sectionsAt) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close closes the open file.
func (s *sectionsAt) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		return s.f.Close()
	}
	return nil
}

// uploadBody is a chunk's bytes as the destination reads them: at any
// offset (counted for progress) and, when they are one run of a local
// file, opened as that file (oci.FileOpener), so that an upload sends the
// file's pages and the bytes the chunking pass read are not read through
// the process again.
type uploadBody struct {
	*io.SectionReader
	sa   *sectionsAt // nil when the bytes are in memory
	sent *atomic.Int64
}

// OpenRange opens the file holding bytes [off, off+n) of the chunk at the
// first of them, or returns nil when the chunk is not one run of a local
// file.
func (b *uploadBody) OpenRange(off, n int64) (*os.File, error) {
	if b.sa == nil {
		return nil, nil
	}
	f, err := b.sa.openRange(off, n)
	if f != nil {
		b.sent.Add(n)
	}
	return f, err
}

// openRange opens the file of a run of one section at [off, off+n) of
// it, after checking the file still holds those bytes; nil when the run
// has more sections or the source's files are not *os.File.
func (s *sectionsAt) openRange(off, n int64) (*os.File, error) {
	if len(s.secs) != 1 || off < 0 || n < 0 || off+n > s.secs[0].n {
		return nil, nil
	}
	sec := s.secs[0]
	rc, err := s.src.Open(context.Background(), sec.path)
	if err != nil {
		s.fail(err)
		return nil, err
	}
	f, ok := rc.(*os.File)
	if !ok {
		rc.Close()
		return nil, nil
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() < sec.off+off+n {
		err = fmt.Errorf("%s: %w", sec.path, ErrFileChanged)
	}
	if err == nil {
		_, err = f.Seek(sec.off+off, io.SeekStart)
	}
	if err != nil {
		f.Close()
		s.fail(err)
		return nil, err
	}
	return f, nil
}

// fail records err as the run's failure, unless one is recorded.
func (s *sectionsAt) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// countingReaderAt counts the bytes read, for progress.
type countingReaderAt struct {
	r io.ReaderAt
	n *atomic.Int64
}

func (c countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}
