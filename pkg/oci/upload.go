package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/errcode"
)

// Upload part sizes.
const (
	// FallbackPartSize is used after a registry or proxy answers 413 to a
	// whole-blob upload (GitHub Packages rejects bodies over 4 MiB).
	FallbackPartSize = 4 << 20
	minPartSize      = 256 << 10
	maxResumes       = 5
)

// repository is a remote repository whose blob uploads bdnvol drives itself:
// a whole-body PUT, or PATCH parts of a configurable size with automatic
// fallback on 413, resumed from the registry's upload offset after a
// failure. Manifests and everything else go through oras-go.
type repository struct {
	*remote.Repository
	client   *auth.Client
	base     string       // scheme://host
	partSize atomic.Int64 // 0: whole-body uploads
	// refsKnown: whether the registry serves the referrers API is known
	// (Referrers).
	refsKnown atomic.Bool
}

// Push stores a blob or manifest. A blob whose content is an io.ReaderAt
// is uploaded with retries and resumption; other content goes to oras-go.
func (r *repository) Push(ctx context.Context, desc ocispec.Descriptor, content io.Reader) error {
	ra, ok := content.(io.ReaderAt)
	if !ok || IsManifest(desc.MediaType) {
		return r.Repository.Push(ctx, desc, content)
	}
	src := &sourceReaderAt{r: ra}
	for session := 1; ; session++ {
		err := r.upload(ctx, desc, src)
		if err == nil {
			return nil
		}
		if serr := src.failure(); serr != nil {
			return fmt.Errorf("upload %s to %s: read the blob: %w", desc.Digest, r.Reference, serr)
		}
		if session >= uploadSessions || ctx.Err() != nil {
			return fmt.Errorf("upload %s to %s: %w", desc.Digest, r.Reference, err)
		}
		// The transport retried what it could within the session; a
		// session the registry refused for good (a body cut or refused so
		// that it will not resume) starts over, reading the bytes again.
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(session) * 500 * time.Millisecond):
		}
	}
}

// uploadSessions bounds the upload sessions tried for one blob.
const uploadSessions = 3

// sourceReaderAt remembers the first failure of the source of an upload, so
// that a failing source is reported as such and not retried.
type sourceReaderAt struct {
	r   io.ReaderAt
	mu  sync.Mutex
	err error
}

func (s *sourceReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := s.r.ReadAt(p, off)
	if err != nil && !(err == io.EOF && n == len(p)) {
		s.fail(err)
	}
	return n, err
}

// fail records err as the source's failure, unless one is recorded.
func (s *sourceReaderAt) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

func (s *sourceReaderAt) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// IsManifest reports whether mt is the media type of an OCI or Docker
// manifest or index (stored under /manifests/, not /blobs/).
func IsManifest(mt string) bool {
	switch mt {
	case ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex,
		"application/vnd.docker.distribution.manifest.v2+json", "application/vnd.docker.distribution.manifest.list.v2+json":
		return true
	}
	return false
}

// statusError is a registry answer other than the one expected.
type statusError struct {
	op     string
	status int
	err    error // the registry's error body, when it sent one
}

func (e *statusError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("%s: %v", e.op, e.err)
	}
	return fmt.Sprintf("%s: %d %s", e.op, e.status, http.StatusText(e.status))
}

func (e *statusError) Unwrap() error { return e.err }

func tooLarge(err error) bool {
	var se *statusError
	return errors.As(err, &se) && se.status == http.StatusRequestEntityTooLarge
}

func (r *repository) upload(ctx context.Context, desc ocispec.Descriptor, ra io.ReaderAt) error {
	loc, err := r.start(ctx)
	if err != nil {
		return err
	}
	if part := r.partSize.Load(); part <= 0 || desc.Size <= part {
		err := r.put(ctx, loc, desc, ra, desc.Size)
		if !tooLarge(err) {
			return err
		}
		// A body limit: switch this repository to parts and start over.
		r.partSize.CompareAndSwap(0, FallbackPartSize)
		if loc, err = r.start(ctx); err != nil {
			return err
		}
	}
	var off int64
	resumes := 0
	for off < desc.Size {
		part := r.partSize.Load()
		n := min(part, desc.Size-off)
		next, err := r.patch(ctx, loc, ra, off, n)
		if err == nil {
			loc, off = next, off+n
			continue
		}
		if tooLarge(err) && part > minPartSize {
			r.partSize.CompareAndSwap(part, part/2)
			continue
		}
		if resumes++; resumes > maxResumes || ctx.Err() != nil {
			return err
		}
		// Ask the registry how much it has, and go on from there.
		got, next, serr := r.status(ctx, loc)
		if serr != nil {
			return fmt.Errorf("%w (and the upload cannot be resumed: %v)", err, serr)
		}
		loc, off = next, got
	}
	return r.put(ctx, loc, desc, nil, 0)
}

// start opens an upload session and returns its location.
func (r *repository) start(ctx context.Context) (string, error) {
	u := fmt.Sprintf("%s/v2/%s/blobs/uploads/", r.base, r.Reference.Repository)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return "", err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusAccepted {
		return "", answerError("start upload", resp)
	}
	return r.location(resp, u)
}

// patch sends bytes [off, off+n) and returns the next location.
func (r *repository) patch(ctx context.Context, loc string, ra io.ReaderAt, off, n int64) (string, error) {
	req, err := bodyRequest(ctx, http.MethodPatch, loc, ra, off, n)
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Content-Range", fmt.Sprintf("%d-%d", off, off+n-1))
	resp, err := r.client.Do(req)
	if err != nil {
		return "", err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusAccepted {
		return "", answerError(fmt.Sprintf("upload bytes %d-%d", off, off+n-1), resp)
	}
	return r.location(resp, loc)
}

// put completes the upload, sending the first n bytes of ra (if any).
func (r *repository) put(ctx context.Context, loc string, desc ocispec.Descriptor, ra io.ReaderAt, n int64) error {
	u, err := url.Parse(loc)
	if err != nil {
		return err
	}
	q := u.Query()
	q.Set("digest", desc.Digest.String())
	u.RawQuery = q.Encode()
	var req *http.Request
	if n > 0 {
		req, err = bodyRequest(ctx, http.MethodPut, u.String(), ra, 0, n)
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodPut, u.String(), nil)
	}
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusCreated {
		return answerError("finish upload", resp)
	}
	return nil
}

// status asks how many bytes an upload session holds.
func (r *repository) status(ctx context.Context, loc string) (int64, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, loc, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return 0, "", answerError("upload status", resp)
	}
	next, err := r.location(resp, loc)
	if err != nil {
		next = loc
	}
	rng := resp.Header.Get("Range") // "0-<last byte>"
	if rng == "" {
		return 0, next, nil
	}
	_, last, ok := strings.Cut(strings.TrimPrefix(rng, "bytes="), "-")
	end, perr := strconv.ParseInt(last, 10, 64)
	if !ok || perr != nil {
		return 0, "", fmt.Errorf("upload status: bad Range %q", rng)
	}
	return end + 1, next, nil
}

// location resolves the Location header of resp against the request URL.
func (r *repository) location(resp *http.Response, reqURL string) (string, error) {
	l := resp.Header.Get("Location")
	if l == "" {
		return "", fmt.Errorf("registry sent no upload location")
	}
	base, err := url.Parse(reqURL)
	if err != nil {
		return "", err
	}
	u, err := base.Parse(l)
	if err != nil {
		return "", fmt.Errorf("bad upload location: %w", err)
	}
	return u.String(), nil
}

// bodyRequest builds a request whose body is bytes [off, off+n) of ra and
// can be replayed, so retries and token refreshes resend it. When the
// blob's content is a FileOpener that opens those bytes as a file, the body
// is that file: over plain HTTP the connection sends its pages with
// sendfile(2), the bytes never copied through the process.
func bodyRequest(ctx context.Context, method, u string, ra io.ReaderAt, off, n int64) (*http.Request, error) {
	open := func() (io.ReadCloser, error) {
		return io.NopCloser(io.NewSectionReader(ra, off, n)), nil
	}
	if s, ok := ra.(*sourceReaderAt); ok {
		if fo, ok := s.r.(FileOpener); ok {
			open = func() (io.ReadCloser, error) {
				f, err := fo.OpenRange(off, n)
				if err != nil {
					s.fail(err)
					return nil, err
				}
				if f == nil {
					return io.NopCloser(io.NewSectionReader(ra, off, n)), nil
				}
				pos, err := f.Seek(0, io.SeekCurrent)
				if err != nil {
					f.Close()
					s.fail(err)
					return nil, err
				}
				return &fileBody{f: f, pos: pos, end: pos + n}, nil
			}
		}
	}
	body, err := open()
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		body.Close()
		return nil, err
	}
	req.ContentLength = n
	req.GetBody = open
	return req, nil
}

// FileOpener is implemented by blob content (an io.ReaderAt) whose bytes
// are a run of a file: an upload opens the file rather than reading the
// bytes with ReadAt, and over plain HTTP the kernel sends them.
type FileOpener interface {
	// OpenRange opens the file holding bytes [off, off+n) of the content,
	// its offset set to the first of them, for the caller to read and
	// close; nil and no error when no one file holds them (they are read
	// with ReadAt then). An error fails the upload as the source's.
	OpenRange(off, n int64) (*os.File, error)
}

// fileBody is a request body read from a file: the connection's ReadFrom
// finds the file by SyscallConn and sends it with sendfile(2) (the
// request's Content-Length bounds it); TLS connections Read it.
type fileBody struct {
	f        *os.File
	pos, end int64 // the file's offset and the body's end in the file
	moved    bool  // sendfile may have moved the offset: pos is stale
}

func (b *fileBody) Read(p []byte) (int, error) {
	if b.moved {
		pos, err := b.f.Seek(0, io.SeekCurrent)
		if err != nil {
			return 0, err
		}
		b.pos, b.moved = pos, false
	}
	if b.pos >= b.end {
		return 0, io.EOF
	}
	n, err := b.f.Read(p[:min(int64(len(p)), b.end-b.pos)])
	b.pos += int64(n)
	return n, err
}

// SyscallConn gives the file's descriptor to sendfile(2).
func (b *fileBody) SyscallConn() (syscall.RawConn, error) {
	b.moved = true
	return b.f.SyscallConn()
}

// Close closes the file.
func (b *fileBody) Close() error { return b.f.Close() }

func answerError(op string, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	se := &statusError{op: op, status: resp.StatusCode}
	var er errcode.ErrorResponse
	if len(body) > 0 && jsonUnmarshal(body, &er) == nil && len(er.Errors) > 0 {
		er.Method, er.StatusCode = resp.Request.Method, resp.StatusCode
		er.URL = resp.Request.URL
		se.err = &er
	}
	return se
}

func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
