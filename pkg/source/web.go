package source

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// web is files served over HTTP(S): one URL, or a list of URLs.
type web struct {
	u      *url.URL
	isList bool
	hc     *http.Client
}

// newWeb checks the URL. URLs with user info or a query string are refused:
// they often carry credentials (signed URLs), which a job must not store.
func newWeb(raw string, opt Options) (backend, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("%w %q: not a URL", ErrUnsupported, redactString(raw))
	}
	if err := checkWebURL(u); err != nil {
		return nil, err
	}
	return &web{u: u, isList: opt.List, hc: newHTTPClient(opt, newNetPolicy(opt), "", "")}, nil
}

func checkWebURL(u *url.URL) error {
	if u.User != nil || u.RawQuery != "" {
		return fmt.Errorf("%w %q: URLs with user info or a query string may carry credentials, which bdnvol does not store in jobs", ErrUnsupported, redactURL(u))
	}
	return nil
}

// redactString redacts a URL given as a string, or hides it when it does
// not parse.
func redactString(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return redactURL(u)
}

func (w *web) String() string   { return w.u.String() }
func (w *web) revision() string { return "" }

// scope is "": an HTTP(S) file has no identifier worth trusting.
func (w *web) scope() string { return "" }

// list returns the one file (named by the URL's last path element), or the
// files of the list: lines of "URL [PATH] [sha256:HEX]", blank lines and #
// comments skipped, URLs relative to the list's.
func (w *web) list(ctx context.Context) ([]*object, error) {
	var objs []*object
	if !w.isList {
		o, err := w.stat(ctx, w.u, "", expectation{})
		if err != nil {
			return nil, err
		}
		return []*object{o}, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := do(w.hc, req, http.StatusOK)
	if err != nil {
		return nil, fmt.Errorf("%s: read the list: %w", w, err)
	}
	defer resp.Body.Close()
	type line struct {
		u    *url.URL
		path string
		want expectation
	}
	var lines []line
	sc := bufio.NewScanner(capBody(resp))
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		u, err := w.u.Parse(f[0])
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("%s: line %d: not an http(s) URL", w, n)
		}
		if err := checkWebURL(u); err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", w, n, err)
		}
		l := line{u: u}
		for _, x := range f[1:] {
			if sum, ok := strings.CutPrefix(x, "sha256:"); ok && hexSHA256.MatchString(sum) {
				l.want = expectSHA256(sum)
			} else if l.path == "" {
				l.path = x
			} else {
				return nil, fmt.Errorf("%s: line %d: want URL [PATH] [sha256:HEX]", w, n)
			}
		}
		if len(lines) >= layout.MaxEntries {
			return nil, fmt.Errorf("%s: the list names more than %d files", w, layout.MaxEntries)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: read the list: %w", w, err)
	}
	objs = make([]*object, len(lines))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, l := range lines {
		g.Go(func() error {
			o, err := w.stat(gctx, l.u, l.path, l.want)
			objs[i] = o
			return err
		})
	}
	return objs, g.Wait()
}

// stat finds the size of a file with HEAD, else with a one-byte range GET.
func (w *web) stat(ctx context.Context, u *url.URL, p string, want expectation) (*object, error) {
	if p == "" {
		p = path.Base(u.Path)
		if p == "/" || p == "." || p == "" {
			return nil, fmt.Errorf("%s: %s: the URL names no file; give a path in a list", w, redactURL(u))
		}
	}
	o := &object{path: p, key: u.String(), want: want}
	size, err := retry(ctx, func() (int64, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodHead, u.String(), nil)
		if err != nil {
			return 0, err
		}
		resp, err := do(w.hc, req, http.StatusOK)
		if err == nil {
			resp.Body.Close()
			if resp.ContentLength >= 0 && resp.Header.Get("Content-Encoding") == "" {
				return resp.ContentLength, nil
			}
		} else if errors.Is(err, ErrForbiddenAddress) {
			return 0, err
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Range", "bytes=0-0")
		req.Header.Set("Accept-Encoding", "identity")
		resp, err = do(w.hc, req, http.StatusPartialContent)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		cr := resp.Header.Get("Content-Range")
		if i := strings.LastIndexByte(cr, '/'); i >= 0 {
			if n, err := strconv.ParseInt(cr[i+1:], 10, 64); err == nil {
				if err := checkSize(n); err != nil {
					return 0, permanentError{fmt.Errorf("GET %s: Content-Range %q: %w", redactURL(u), cr, err)}
				}
				return n, nil
			}
		}
		return 0, permanentError{fmt.Errorf("GET %s: no size in Content-Range %q", redactURL(u), cr)}
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", w, err)
	}
	o.size = size
	return o, nil
}

func (w *web) get(ctx context.Context, o *object, off, n int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.key, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept-Encoding", "identity")
	data, _, err := getRange(w.hc, req, off, n)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", w, o.path, err)
	}
	return data, nil
}
