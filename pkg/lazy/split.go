package lazy

import (
	"context"
	"fmt"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// splitMin is the smallest chunk a read that waits for it fetches as
// several concurrent range requests: one connection may be slower than the
// link, and the reader waits for the whole chunk.
const splitMin = 4 << 20

// splitPart is the size of each range request of a split fetch.
const splitPart = 2 << 20

// maxSplitParts bounds the range requests of one split fetch.
const maxSplitParts = 8

// splitFetcher fetches a large blob as concurrent range requests and
// serves their bytes in order. The bytes are unverified: the cache checks
// the whole blob against its digest before anything is served from it.
type splitFetcher struct {
	rangeSource
	parts int // most concurrent range requests
	// probe: the source has not served a range yet, so the other parts
	// start only once the first one is answered; a source without ranges
	// is asked once.
	probe bool
}

type partResult struct {
	data []byte
	err  error
}

// Fetch starts the range requests of desc and returns a reader of the
// whole blob; blobs under splitMin are fetched in one request.
func (s splitFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if desc.Size < splitMin || s.parts < 2 {
		return s.rangeSource.Fetch(ctx, desc)
	}
	n := int(min(int64(min(s.parts, maxSplitParts)), (desc.Size+splitPart-1)/splitPart))
	size := (desc.Size + int64(n) - 1) / int64(n)
	ctx, cancel := context.WithCancel(ctx)
	r := &partsReader{cancel: cancel, parts: make([]chan partResult, n)}
	for i := range n {
		r.parts[i] = make(chan partResult, 1)
	}
	var start func(i int)
	start = func(i int) {
		off := int64(i) * size
		m := min(size, desc.Size-off)
		ch := r.parts[i]
		go func() {
			rc, err := s.FetchRange(ctx, desc, off, m)
			if i == 0 && s.probe {
				for j := 1; j < n; j++ {
					if err != nil {
						r.parts[j] <- partResult{err: err}
					} else {
						start(j)
					}
				}
			}
			if err != nil {
				ch <- partResult{err: err}
				return
			}
			defer rc.Close()
			b := make([]byte, m)
			k, err := io.ReadFull(rc, b)
			if err != nil {
				err = fmt.Errorf("range %d+%d of %s: %d bytes: %w", off, m, desc.Digest, k, err)
			}
			ch <- partResult{data: b, err: err}
		}()
	}
	if s.probe {
		start(0)
	} else {
		for i := range n {
			start(i)
		}
	}
	return r, nil
}

// partsReader reads the parts of a split fetch in order.
type partsReader struct {
	cancel context.CancelFunc
	parts  []chan partResult
	cur    []byte
	next   int
	err    error
}

func (r *partsReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if r.next == len(r.parts) {
			return 0, io.EOF
		}
		res := <-r.parts[r.next]
		r.parts[r.next] = nil
		r.next++
		if res.err != nil {
			r.err = res.err
			return 0, r.err
		}
		r.cur = res.data
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// Close cancels the range requests still running.
func (r *partsReader) Close() error {
	r.cancel()
	return nil
}
