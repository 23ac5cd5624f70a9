package lazy

import (
	"context"
	"io"
	"sync/atomic"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// counted returns src counting its requests in v.fetches and v.fetching
// (until the body is closed), keeping the optional interfaces the volume
// and the cache ask of a source (ranges, NoSplit, Local). A chunk the
// cache holds asks the source nothing, so the counts are of what the
// volume fetches.
func (v *Volume) counted(src content.Fetcher) content.Fetcher {
	c := countedSource{src: src, v: v}
	if _, ok := src.(rangeSource); ok {
		return countedRangeSource{c}
	}
	return c
}

type countedSource struct {
	src content.Fetcher
	v   *Volume
}

func (c countedSource) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	return c.track(c.src.Fetch(ctx, d))
}

// Local reports what the source reports (it reads local files), false if
// it does not say.
func (c countedSource) Local() bool {
	l, ok := c.src.(interface{ Local() bool })
	return ok && l.Local()
}

// NoSplit reports what the source reports, false if it does not say.
func (c countedSource) NoSplit() bool {
	ns, ok := c.src.(interface{ NoSplit() bool })
	return ok && ns.NoSplit()
}

func (c countedSource) track(rc io.ReadCloser, err error) (io.ReadCloser, error) {
	c.v.fetches.Add(1)
	c.v.touch()
	if err != nil {
		return nil, err
	}
	c.v.fetching.Add(1)
	return &countedBody{ReadCloser: rc, v: c.v}, nil
}

type countedRangeSource struct{ countedSource }

func (c countedRangeSource) FetchRange(ctx context.Context, d ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	return c.track(c.src.(rangeSource).FetchRange(ctx, d, off, n))
}

// countedBody is a response body that counts itself out when closed.
type countedBody struct {
	io.ReadCloser
	v    *Volume
	done atomic.Bool
}

// WriteTo keeps the body's own WriteTo, where it has one, for io.Copy.
func (b *countedBody) WriteTo(w io.Writer) (int64, error) {
	if wt, ok := b.ReadCloser.(io.WriterTo); ok {
		return wt.WriteTo(w)
	}
	return io.Copy(w, struct{ io.Reader }{b.ReadCloser})
}

// Checked returns the verified bytes the body passes through, if it does.
func (b *countedBody) Checked() *verify.Checked { return verify.CheckedOf(b.ReadCloser) }

func (b *countedBody) Close() error {
	if b.done.CompareAndSwap(false, true) {
		b.v.fetching.Add(-1)
		b.v.touch()
	}
	return b.ReadCloser.Close()
}
