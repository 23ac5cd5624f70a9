package source

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/bdnvol/bdnvol/internal/byterange"
	"github.com/bdnvol/bdnvol/internal/ratelimit"
)

// HTTPError is an unexpected HTTP answer from a source.
type HTTPError struct {
	Method string
	URL    string // without user info or query
	Status int
	Body   string // the start of the answer's body
}

// Error names the request and the status.
func (e *HTTPError) Error() string {
	s := fmt.Sprintf("%s %s: %d %s", e.Method, e.URL, e.Status, http.StatusText(e.Status))
	if e.Body != "" {
		s += ": " + e.Body
	}
	return s
}

// authTransport adds the Authorization header to requests for one host
// only, so a token never follows a redirect to another host (a CDN).
type authTransport struct {
	base   http.RoundTripper
	host   string
	header string // "" sends none
	ua     string
}

func (t *authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Del("Authorization")
	if t.header != "" && strings.EqualFold(r.URL.Host, t.host) {
		r.Header.Set("Authorization", t.header)
	}
	if t.ua != "" {
		r.Header.Set("User-Agent", t.ua)
	}
	return t.base.RoundTrip(r)
}

// newHTTPClient returns a client that sends authHeader to authHost only
// and reaches only the addresses pol allows.
func newHTTPClient(opt Options, pol *netPolicy, authHost, authHeader string) *http.Client {
	return &http.Client{Transport: &authTransport{base: ratelimit.Transport(pol.transport(opt), opt.Limiter), host: authHost, header: authHeader, ua: opt.UserAgent}}
}

// do sends req and returns the response when its status is one of ok;
// otherwise it closes the body and returns an *HTTPError. Errors carry no
// query strings.
func do(hc *http.Client, req *http.Request, ok ...int) (*http.Response, error) {
	resp, err := hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			u, _ := url.Parse(ue.URL)
			return nil, fmt.Errorf("%s %s: %w", req.Method, redactURL(u), ue.Err)
		}
		return nil, fmt.Errorf("%s %s: %w", req.Method, redactURL(req.URL), err)
	}
	for _, s := range ok {
		if resp.StatusCode == s {
			return resp, nil
		}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	body := strings.Join(strings.Fields(string(b)), " ")
	herr := &HTTPError{Method: req.Method, URL: redactURL(resp.Request.URL), Status: resp.StatusCode, Body: body}
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("%w: %w", ErrNotFound, herr)
	}
	return nil, herr
}

// getRange GETs n bytes at off of u with a Range request. A server that
// ignores Range (200) is read from the start and skipped to off.
func getRange(hc *http.Client, req *http.Request, off, n int64) ([]byte, *http.Response, error) {
	if off < 0 || n < 0 || n > 1<<30 {
		return nil, nil, permanentError{fmt.Errorf("%s %s: range of %d bytes at %d is out of range", req.Method, redactURL(req.URL), n, off)}
	}
	req.Header.Set("Range", byterange.Header(off, n))
	resp, err := do(hc, req, http.StatusOK, http.StatusPartialContent)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	name := req.Method + " " + redactURL(resp.Request.URL)
	if resp.StatusCode == http.StatusPartialContent {
		start, ok := byterange.Start(resp.Header.Get("Content-Range"))
		if !ok || start != off {
			return nil, resp, permanentError{fmt.Errorf("%s: asked for %s, got Content-Range %q", name, byterange.Header(off, n), resp.Header.Get("Content-Range"))}
		}
	} else if off > 0 {
		if _, err := io.CopyN(io.Discard, resp.Body, off); err != nil {
			return nil, resp, fmt.Errorf("%s: %w", name, err)
		}
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		return nil, resp, fmt.Errorf("%s: range %s: %w", name, byterange.Header(off, n), err)
	}
	return buf, resp, nil
}

// MaxListingBody bounds the bytes of one listing answer read into memory:
// a Hub tree page, a GCS listing page, a --list body.
const MaxListingBody = 64 << 20

// maxListPages bounds the pages of one listing (a var for tests).
var maxListPages = 10_000

// capReader reads r and fails once more than left bytes came.
type capReader struct {
	r    io.Reader
	left int64
	name string
}

// capBody returns a reader of resp's body that fails with a permanent
// error once it exceeds MaxListingBody.
func capBody(resp *http.Response) io.Reader {
	return &capReader{r: resp.Body, left: MaxListingBody, name: resp.Request.Method + " " + redactURL(resp.Request.URL)}
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, c.tooLarge()
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n, c.tooLarge()
	}
	return n, err
}

func (c *capReader) tooLarge() error {
	return permanentError{fmt.Errorf("%s: the answer exceeds %d MiB", c.name, MaxListingBody>>20)}
}

// pager guards a listing against a source whose pagination does not end:
// a page cursor seen before, or more than maxListPages pages, is an error.
type pager struct {
	name  string // the source, for errors
	seen  map[string]bool
	pages int
}

// next records that the page named by cursor is about to be fetched.
func (p *pager) next(cursor string) error {
	if p.seen == nil {
		p.seen = map[string]bool{}
	}
	if p.seen[cursor] {
		return fmt.Errorf("%s: the listing repeats a page (after %d pages); its pagination loops", p.name, p.pages)
	}
	if p.pages >= maxListPages {
		return fmt.Errorf("%s: the listing has more than %d pages", p.name, maxListPages)
	}
	p.seen[cursor] = true
	p.pages++
	return nil
}
