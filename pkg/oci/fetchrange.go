package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/byterange"
)

// ErrRangeUnsupported is returned by FetchRange when the registry answers
// a Range request with the whole blob; callers fetch whole blobs instead.
var ErrRangeUnsupported = fmt.Errorf("the registry does not serve byte ranges: %w", errors.ErrUnsupported)

// RangeFetcher fetches part of a blob.
type RangeFetcher interface {
	// FetchRange returns the n bytes at off of the blob desc. The bytes
	// are not verified: the caller checks them.
	FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error)
}

var (
	_ RangeFetcher = (*repository)(nil)
	_ RangeFetcher = (*layoutStore)(nil)
)

// FetchRange GETs the blob with one closed Range header (following
// redirects, as blob GETs do) and returns the n bytes of the 206 answer.
func (r *repository) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n <= 0 || off+n > desc.Size {
		return nil, fmt.Errorf("blob %s: range %d+%d outside its %d bytes", desc.Digest, off, n, desc.Size)
	}
	u := fmt.Sprintf("%s/v2/%s/blobs/%s", r.base, r.Reference.Repository, desc.Digest)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	want := byterange.Header(off, n)
	req.Header.Set("Range", want)
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s of %s from %s: %w", want, desc.Digest, r.Reference, err)
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
		if start, ok := byterange.Start(resp.Header.Get("Content-Range")); !ok || start != off {
			drain(resp)
			return nil, fmt.Errorf("fetch %s of %s from %s: answered Content-Range %q", want, desc.Digest, r.Reference, resp.Header.Get("Content-Range"))
		}
		return struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, n), resp.Body}, nil
	case http.StatusOK:
		resp.Body.Close()
		return nil, fmt.Errorf("fetch %s of %s from %s: %w", want, desc.Digest, r.Reference, ErrRangeUnsupported)
	case http.StatusNotFound:
		defer drain(resp)
		return nil, fmt.Errorf("fetch %s of %s from %s: %w: %w", want, desc.Digest, r.Reference, ErrNotFound, answerError("range GET", resp))
	default:
		defer drain(resp)
		return nil, fmt.Errorf("fetch %s of %s from %s: %w", want, desc.Digest, r.Reference, answerError("range GET", resp))
	}
}

// FetchRange reads the range from the blob's file in the layout, once it is
// known to be a regular file of the blob's size.
func (s *layoutStore) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n <= 0 || off+n > desc.Size {
		return nil, fmt.Errorf("blob %s: range %d+%d outside its %d bytes", desc.Digest, off, n, desc.Size)
	}
	f, err := s.openBlob(desc)
	if err != nil {
		return nil, err
	}
	return readCloser{io.NewSectionReader(f, off, n), f}, nil
}
