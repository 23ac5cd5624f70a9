package source

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// DefaultGCSEndpoint serves the GCS JSON API when STORAGE_EMULATOR_HOST is
// unset.
const DefaultGCSEndpoint = "https://storage.googleapis.com"

// gcs is the objects under a prefix of a Google Cloud Storage bucket, read
// through the JSON API with plain HTTP.
type gcs struct {
	base   *url.URL
	bucket string
	prefix string
	hc     *http.Client
	token  func(ctx context.Context) string
	uri    string
}

// newGCS parses BUCKET[/PREFIX]. STORAGE_EMULATOR_HOST selects an emulator
// (no credentials); otherwise GOOGLE_OAUTH_ACCESS_TOKEN, else the metadata
// server's token on Google Cloud, else anonymous access.
func newGCS(rest string, opt Options) (backend, error) {
	bucket, prefix, _ := strings.Cut(rest, "/")
	if bucket == "" {
		return nil, fmt.Errorf("%w %q: want gs://BUCKET[/PREFIX]", ErrUnsupported, "gs://"+rest)
	}
	g := &gcs{bucket: bucket, prefix: prefix, uri: "gs://" + rest}
	baseStr := DefaultGCSEndpoint
	emulator := os.Getenv("STORAGE_EMULATOR_HOST")
	if emulator != "" {
		baseStr = emulator
		if !strings.Contains(baseStr, "://") {
			baseStr = "http://" + baseStr
		}
	}
	base, err := url.Parse(strings.TrimSuffix(baseStr, "/"))
	if err != nil || base.Host == "" {
		return nil, fmt.Errorf("%w: GCS endpoint %q is not a URL", ErrUnsupported, baseStr)
	}
	g.base = base
	g.token = func(context.Context) string { return "" }
	if emulator == "" {
		if tok := os.Getenv("GOOGLE_OAUTH_ACCESS_TOKEN"); tok != "" {
			g.token = func(context.Context) string { return tok }
		} else {
			g.token = metadataToken(opt)
		}
	}
	var configured *url.URL
	if emulator != "" {
		configured = base
	}
	g.hc = &http.Client{Transport: &gcsAuth{g: g, base: newHTTPClient(opt, newNetPolicy(opt, configured), "", "").Transport}}
	return g, nil
}

// gcsAuth adds the OAuth token to requests for the storage host only.
type gcsAuth struct {
	g    *gcs
	base http.RoundTripper
}

func (t *gcsAuth) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.EqualFold(req.URL.Host, t.g.base.Host) {
		return t.base.RoundTrip(req)
	}
	tok := t.g.token(req.Context())
	if tok == "" {
		return t.base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	r.Header.Set("Authorization", "Bearer "+tok)
	return t.base.RoundTrip(r)
}

// metadataToken returns a function that fetches (and caches until shortly
// before it expires) the default service account's token from the GCE
// metadata server; it returns "" when there is no metadata server.
func metadataToken(opt Options) func(context.Context) string {
	var (
		mu      sync.Mutex
		tok     string
		expires time.Time
		failed  bool
	)
	host := os.Getenv("GCE_METADATA_HOST")
	if host == "" {
		host = "metadata.google.internal"
	}
	// The metadata server is where the token comes from, not a source: its
	// client may reach it (and only it: no redirects are followed).
	mdOpt := opt
	mdOpt.AllowLinkLocal = true
	hc := newHTTPClient(mdOpt, newNetPolicy(mdOpt, &url.URL{Host: host}), "", "")
	hc.Timeout = 2 * time.Second
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return func(ctx context.Context) string {
		mu.Lock()
		defer mu.Unlock()
		if failed || (tok != "" && time.Now().Before(expires)) {
			return tok
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			"http://"+host+"/computeMetadata/v1/instance/service-accounts/default/token", nil)
		if err != nil {
			failed = true
			return ""
		}
		req.Header.Set("Metadata-Flavor", "Google")
		resp, err := do(hc, req, http.StatusOK)
		if err != nil {
			failed = true
			return ""
		}
		defer resp.Body.Close()
		var v struct {
			AccessToken string `json:"access_token"`
			ExpiresIn   int    `json:"expires_in"`
		}
		if json.NewDecoder(resp.Body).Decode(&v) != nil {
			failed = true
			return ""
		}
		tok, expires = v.AccessToken, time.Now().Add(time.Duration(v.ExpiresIn)*time.Second-time.Minute)
		return tok
	}
}

func (g *gcs) String() string   { return g.uri }
func (g *gcs) revision() string { return "" }

// scope is the endpoint, bucket and prefix: identifiers are compared only
// for the same object name of the same bucket.
func (g *gcs) scope() string {
	return identifier(idField{"store", "gcs"}, idField{"endpoint", g.base.String()}, idField{"bucket", g.bucket}, idField{"prefix", g.prefix})
}

// gcsObject is the part of a GCS object resource the sync uses.
type gcsObject struct {
	Name       string `json:"name"`
	Size       string `json:"size"`
	MD5Hash    string `json:"md5Hash"`
	Generation string `json:"generation"`
	CRC32C     string `json:"crc32c"`
}

func (g *gcs) bucketURL() string {
	return g.base.String() + "/storage/v1/b/" + url.PathEscape(g.bucket) + "/o"
}

// list lists the objects under the prefix (as a directory), pinning each
// object's generation; when there are none and the prefix names an
// object, the source is that one object.
func (g *gcs) list(ctx context.Context) ([]*object, error) {
	dir := g.prefix
	if dir != "" && !strings.HasSuffix(dir, "/") {
		dir += "/"
	}
	var out []*object
	token := ""
	pg := pager{name: g.String()}
	for {
		if err := pg.next(token); err != nil {
			return nil, err
		}
		q := url.Values{"prefix": {dir}}
		if token != "" {
			q.Set("pageToken", token)
		}
		var page struct {
			Items         []gcsObject `json:"items"`
			NextPageToken string      `json:"nextPageToken"`
		}
		if err := g.getJSON(ctx, g.bucketURL()+"?"+q.Encode(), &page); err != nil {
			return nil, fmt.Errorf("%s: list: %w", g, err)
		}
		for _, it := range page.Items {
			rel := strings.TrimPrefix(it.Name, dir)
			if rel == "" || strings.HasSuffix(it.Name, "/") {
				continue
			}
			o, err := g.object(it, rel)
			if err != nil {
				return nil, err
			}
			if len(out) >= layout.MaxEntries {
				return nil, fmt.Errorf("%s: the prefix holds more than %d objects", g, layout.MaxEntries)
			}
			out = append(out, o)
		}
		if page.NextPageToken == "" {
			break
		}
		token = page.NextPageToken
	}
	if len(out) == 0 && g.prefix != "" && !strings.HasSuffix(g.prefix, "/") {
		var it gcsObject
		if err := g.getJSON(ctx, g.bucketURL()+"/"+url.PathEscape(g.prefix), &it); err == nil {
			o, err := g.object(it, path.Base(g.prefix))
			if err != nil {
				return nil, err
			}
			out = append(out, o)
		}
	}
	return out, nil
}

func (g *gcs) object(it gcsObject, rel string) (*object, error) {
	size, err := strconv.ParseInt(it.Size, 10, 64)
	if err != nil || size < 0 {
		return nil, fmt.Errorf("%s: object %q: bad size %q", g, it.Name, it.Size)
	}
	return &object{path: rel, size: size, key: it.Name, gen: it.Generation, want: expectMD5Base64(it.MD5Hash), id: gcsIdentifier(it)}, nil
}

func (g *gcs) getJSON(ctx context.Context, u string, v any) error {
	_, err := retry(ctx, func() (struct{}, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return struct{}{}, err
		}
		resp, err := do(g.hc, req, http.StatusOK)
		if err != nil {
			return struct{}{}, err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(capBody(resp)).Decode(v); err != nil {
			return struct{}{}, fmt.Errorf("GET %s: %w", redactURL(resp.Request.URL), err)
		}
		return struct{}{}, nil
	})
	return err
}

// get reads a range of the object's pinned generation.
func (g *gcs) get(ctx context.Context, o *object, off, n int64) ([]byte, error) {
	q := url.Values{"alt": {"media"}}
	if o.gen != "" {
		q.Set("generation", o.gen)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.bucketURL()+"/"+url.PathEscape(o.key)+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	data, _, err := getRange(g.hc, req, off, n)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", g, o.key, err)
	}
	return data, nil
}
