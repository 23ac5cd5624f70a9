package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// blockReader is an io.ReaderAt over a remote file that fetches it in
// blocks of bs bytes, the block being read and up to ahead blocks after it
// in parallel. Blocks before the one being read are dropped, so a reader
// that goes forward holds at most ahead+1 blocks.
type blockReader struct {
	ctx    context.Context // ends when the file is closed
	cancel context.CancelFunc
	size   int64
	bs     int64
	ahead  int
	reqs   *semaphore.Weighted // range requests in flight, per source
	buffer *semaphore.Weighted // readahead bytes, per source
	fetch  func(ctx context.Context, off, n int64) ([]byte, error)
	name   string

	mu     sync.Mutex
	blocks map[int64]*block
	wg     sync.WaitGroup
}

type block struct {
	done chan struct{}
	data []byte
	err  error
	held int64 // bytes taken from the readahead budget
}

func (r *blockReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%s: negative offset", r.name)
	}
	n := 0
	for n < len(p) && off < r.size {
		bi := off / r.bs
		b := r.block(bi)
		select {
		case <-b.done:
		case <-r.ctx.Done():
			return n, r.ctx.Err()
		}
		if b.err != nil {
			r.mu.Lock()
			delete(r.blocks, bi) // a later read tries again
			r.mu.Unlock()
			return n, b.err
		}
		k := copy(p[n:], b.data[off-bi*r.bs:])
		n += k
		off += int64(k)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// block returns block bi, starting it and the readahead after it, and drops
// the blocks before it.
func (r *blockReader) block(bi int64) *block {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, b := range r.blocks {
		if k < bi {
			delete(r.blocks, k)
			r.release(b)
		}
	}
	last := (r.size - 1) / r.bs
	for k := bi; k <= min(last, bi+int64(r.ahead)); k++ {
		if _, ok := r.blocks[k]; ok {
			continue
		}
		n := min(r.bs, r.size-k*r.bs)
		var held int64
		if k > bi {
			if !r.buffer.TryAcquire(n) {
				break // over the readahead budget: fetch when read
			}
			held = n
		}
		b := &block{done: make(chan struct{}), held: held}
		r.blocks[k] = b
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer close(b.done)
			if err := r.reqs.Acquire(r.ctx, 1); err != nil {
				b.err = err
				return
			}
			defer r.reqs.Release(1)
			b.data, b.err = r.fetch(r.ctx, k*r.bs, n)
		}()
	}
	return r.blocks[bi]
}

// release returns a dropped block's readahead bytes once its fetch ends.
func (r *blockReader) release(b *block) {
	if b.held == 0 {
		return
	}
	held := b.held
	b.held = 0
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		<-b.done
		r.buffer.Release(held)
	}()
}

// Close stops the fetches in flight and frees the blocks.
func (r *blockReader) Close() error {
	r.cancel()
	r.mu.Lock()
	for k, b := range r.blocks {
		delete(r.blocks, k)
		r.release(b)
	}
	r.mu.Unlock()
	r.wg.Wait()
	return nil
}

// permanentError marks an error that retrying does not help with.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// retry calls f up to 4 times with growing pauses while it fails with an
// error that may be transient.
func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	delay := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		v, err = f()
		if err == nil || attempt == 3 || ctx.Err() != nil || !transient(err) {
			return v, err
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return v, err
		}
		delay *= 3
	}
}

// transient reports whether err may go away on a retry: anything but a
// permanent error, a cancellation, a digest mismatch, a refused address,
// or an HTTP answer other than 408, 429 and 5xx.
func transient(err error) bool {
	var pe permanentError
	if errors.As(err, &pe) || errors.Is(err, context.Canceled) || errors.Is(err, ErrDigestMismatch) ||
		errors.Is(err, ErrForbiddenAddress) {
		return false
	}
	var he *HTTPError
	if errors.As(err, &he) {
		return he.Status == 408 || he.Status == 429 || he.Status >= 500
	}
	return true // network errors, short bodies, and errors of unknown kind
}
