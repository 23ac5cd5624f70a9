package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// DefaultHubEndpoint is the Hugging Face Hub used when HF_ENDPOINT is unset.
const DefaultHubEndpoint = "https://huggingface.co"

// hub is a Hugging Face Hub repository at a revision, read through the
// Hub's HTTP API as huggingface_hub reads it.
type hub struct {
	ep   *url.URL
	kind string // "models" or "datasets"
	repo string // ORG/NAME
	rev  string
	hc   *http.Client
	sha  string // the commit rev resolved to, set by list
}

var hexCommit = regexp.MustCompile(`^[0-9a-f]{40}$`)

// newHub parses [datasets/|models/]ORG/REPO[@REVISION] and reads HF_ENDPOINT
// and HF_TOKEN.
func newHub(rest string, opt Options) (backend, error) {
	spec, rev, _ := strings.Cut(rest, "@")
	if rev == "" {
		rev = "main"
	}
	kind := "models"
	if s, ok := strings.CutPrefix(spec, "datasets/"); ok {
		kind, spec = "datasets", s
	} else if s, ok := strings.CutPrefix(spec, "models/"); ok {
		spec = s
	}
	spec = strings.TrimSuffix(spec, "/")
	parts := strings.Split(spec, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			parts = nil
		}
	}
	if len(parts) < 1 || len(parts) > 2 {
		return nil, fmt.Errorf("%w %q: want hf://ORG/REPO[@REVISION] or hf://datasets/ORG/REPO[@REVISION]", ErrUnsupported, "hf://"+rest)
	}
	epStr := strings.TrimSuffix(os.Getenv("HF_ENDPOINT"), "/")
	configured := epStr != ""
	if !configured {
		epStr = DefaultHubEndpoint
	}
	ep, err := url.Parse(epStr)
	if err != nil || (ep.Scheme != "http" && ep.Scheme != "https") || ep.Host == "" {
		return nil, fmt.Errorf("%w: HF_ENDPOINT %q is not an http(s) URL", ErrUnsupported, epStr)
	}
	token := os.Getenv("HF_TOKEN")
	if token == "" {
		token = os.Getenv("HUGGING_FACE_HUB_TOKEN")
	}
	auth := ""
	if token != "" {
		auth = "Bearer " + token
	}
	// Only an endpoint the user chose is trusted with its kind of address.
	pol := newNetPolicy(opt)
	if configured {
		pol = newNetPolicy(opt, ep)
	}
	return &hub{ep: ep, kind: kind, repo: spec, rev: rev, hc: newHTTPClient(opt, pol, ep.Host, auth)}, nil
}

func (h *hub) String() string {
	s := "hf://"
	if h.kind == "datasets" {
		s += "datasets/"
	}
	return s + h.repo + "@" + h.rev
}

func (h *hub) revision() string { return h.sha }

// scope is the Hub and the repository: a file is matched across commits,
// at the same path of the same repository only.
func (h *hub) scope() string {
	return identifier(idField{"store", "hf"}, idField{"endpoint", h.ep.String()}, idField{"repo", h.kind + "/" + h.repo})
}

// api returns the URL of an API path under /api/{kind}/{repo}/.
func (h *hub) api(elems ...string) string {
	return h.ep.String() + "/api/" + h.kind + "/" + h.repo + "/" + strings.Join(elems, "/")
}

func (h *hub) getJSON(ctx context.Context, u string, v any) (*http.Response, error) {
	return retry(ctx, func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := do(h.hc, req, http.StatusOK)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(capBody(resp)).Decode(v); err != nil {
			return nil, fmt.Errorf("GET %s: %w", redactURL(resp.Request.URL), err)
		}
		return resp, nil
	})
}

// treeEntry is one element of the Hub's tree listing.
type treeEntry struct {
	Type string `json:"type"` // "file" or "directory"
	Path string `json:"path"`
	Size int64  `json:"size"`
	Oid  string `json:"oid"` // git blob id
	LFS  *struct {
		Oid  string `json:"oid"` // SHA-256 of the file
		Size int64  `json:"size"`
	} `json:"lfs"`
}

// list pins the revision to its commit and lists the files at it,
// following the Link header of paginated answers.
func (h *hub) list(ctx context.Context) ([]*object, error) {
	var info struct {
		SHA string `json:"sha"`
	}
	if _, err := h.getJSON(ctx, h.api("revision", url.PathEscape(h.rev)), &info); err != nil {
		return nil, fmt.Errorf("%s: resolve revision: %w", h, err)
	}
	if !hexCommit.MatchString(info.SHA) {
		return nil, fmt.Errorf("%s: the Hub resolved the revision to %q, not a commit", h, info.SHA)
	}
	h.sha = info.SHA
	var out []*object
	next := h.api("tree", h.sha) + "?recursive=true&expand=false"
	pg := pager{name: h.String()}
	for next != "" {
		if err := pg.next(next); err != nil {
			return nil, err
		}
		var entries []treeEntry
		resp, err := h.getJSON(ctx, next, &entries)
		if err != nil {
			return nil, fmt.Errorf("%s: list files: %w", h, err)
		}
		for _, e := range entries {
			if e.Type != "file" {
				continue
			}
			o := &object{path: e.Path, size: e.Size, key: e.Path}
			switch {
			case e.LFS != nil:
				o.size = e.LFS.Size
				if sum := strings.ToLower(e.LFS.Oid); hexSHA256.MatchString(sum) {
					o.want = expectSHA256(sum)
				}
			case hexCommit.MatchString(strings.ToLower(e.Oid)):
				o.want = expectGitSHA1(strings.ToLower(e.Oid))
				// A non-LFS file's git blob id hashes its bytes (SHA-1,
				// as git does): its identifier. An LFS file is matched by
				// its SHA-256, which is its digest.
				o.id = identifier(idField{"size", strconv.FormatInt(e.Size, 10)}, idField{"git-blob", strings.ToLower(e.Oid)})
			}
			if len(out) >= layout.MaxEntries {
				return nil, fmt.Errorf("%s: the tree lists more than %d files", h, layout.MaxEntries)
			}
			out = append(out, o)
		}
		next = nextLink(resp)
	}
	return out, nil
}

var hexSHA256 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// linkNext matches the rel="next" target of a Link header.
var linkNext = regexp.MustCompile(`<([^>]+)>\s*;\s*rel="?next"?`)

// nextLink returns the absolute URL of the next page, or "".
func nextLink(resp *http.Response) string {
	for _, l := range resp.Header.Values("Link") {
		if m := linkNext.FindStringSubmatch(l); m != nil {
			u, err := resp.Request.URL.Parse(m[1])
			if err == nil {
				return u.String()
			}
		}
	}
	return ""
}

// resolveURL is where the Hub serves a file of the pinned commit.
func (h *hub) resolveURL(p string) string {
	prefix := ""
	if h.kind == "datasets" {
		prefix = "datasets/"
	}
	return h.ep.String() + "/" + prefix + h.repo + "/resolve/" + h.sha + "/" + escapePath(p)
}

// get reads a range of a file through /resolve, which redirects LFS files
// to a CDN; the CDN URL is reused for later ranges until it stops working.
func (h *hub) get(ctx context.Context, o *object, off, n int64) ([]byte, error) {
	o.mu.Lock()
	loc := o.loc
	o.mu.Unlock()
	if loc != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, loc, nil)
		if err != nil {
			return nil, err
		}
		data, _, err := getRange(h.hc, req, off, n)
		var he *HTTPError
		if err == nil || !errors.As(err, &he) || he.Status >= 500 {
			return data, err
		}
		// A signed CDN URL expired: ask the Hub again.
		o.mu.Lock()
		o.loc = ""
		o.mu.Unlock()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.resolveURL(o.path), nil)
	if err != nil {
		return nil, err
	}
	data, resp, err := getRange(h.hc, req, off, n)
	if err != nil {
		return nil, err
	}
	if final := resp.Request.URL; !strings.EqualFold(final.Host, h.ep.Host) {
		o.mu.Lock()
		o.loc = final.String()
		o.mu.Unlock()
	}
	return data, nil
}

// escapePath escapes each element of a slash path for a URL.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}
