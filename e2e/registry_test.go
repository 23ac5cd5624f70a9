package e2e

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/sirupsen/logrus"
)

func init() {
	// The registry logs through logrus' standard logger; keep test output readable.
	logrus.SetLevel(logrus.PanicLevel)
	logrus.SetOutput(io.Discard)
}

// target is where a test pushes to: a registry or an OCI image layout.
type target struct {
	name string
	reg  *registry // nil for an OCI layout
	root string    // for an OCI layout: the parent of the layouts tests create
}

// repo returns the reference prefix (everything before :tag or @digest) of a
// repository or layout called name.
func (tg target) repo(name string) string {
	if tg.reg != nil {
		return tg.reg.Host + "/" + name
	}
	return "oci:" + tg.root + "/" + name
}

// forTargets runs f as one subtest per target.
func forTargets(t *testing.T, f func(t *testing.T, tg target)) {
	forKinds(t, []string{"distribution", "ggcr", "oci-layout"}, f)
}

// forKinds is forTargets over the named kinds: those of forTargets, and
// "ggcr-referrers" (go-containerregistry's registry serving the OCI 1.1
// referrers API).
func forKinds(t *testing.T, kinds []string, f func(t *testing.T, tg target)) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			var tg target
			switch kind {
			case "distribution":
				tg = target{name: kind, reg: newDistribution(t)}
			case "ggcr":
				tg = target{name: kind, reg: newGGCR(t)}
			case "ggcr-referrers":
				tg = target{name: kind, reg: newGGCRReferrers(t)}
			default:
				tg = target{name: kind, root: t.TempDir()}
			}
			f(t, tg)
		})
	}
}

// registry is a registry served on loopback with a counting, corrupting
// middleware in front of it.
type registry struct {
	URL  string // http://127.0.0.1:port
	Host string // 127.0.0.1:port
	srv  *httptest.Server

	mu      sync.Mutex
	stats   stats
	corrupt map[string]bool // blob digests whose GET bodies get a flipped byte
}

// stats counts what a registry saw.
type stats struct {
	Requests     map[string]int // "METHOD kind", kind is base, blob, upload, manifest, tags, other
	BlobBytesIn  int64          // request bodies of blob upload POST/PUT/PATCH
	BlobBytesOut int64          // response bodies of blob GETs
	BlobGets     map[string]int // blob GETs by digest
}

func newStats() stats { return stats{Requests: map[string]int{}, BlobGets: map[string]int{}} }

// distributionConfig is the configuration of the test registries:
// filesystem storage under root, deletes on, quiet.
func distributionConfig(root string) *configuration.Configuration {
	cfg := &configuration.Configuration{}
	cfg.Version = "0.1"
	cfg.Storage = configuration.Storage{
		"filesystem": configuration.Parameters{"rootdirectory": root},
		"delete":     configuration.Parameters{"enabled": true},
		"maintenance": configuration.Parameters{
			"uploadpurging": map[any]any{"enabled": false},
		},
	}
	cfg.HTTP.Secret = "bdnvol-e2e-secret"
	cfg.Log.AccessLog.Disabled = true
	cfg.Log.Level = "panic"
	return cfg
}

// newDistribution starts CNCF distribution v3 with filesystem storage.
func newDistribution(t testing.TB) *registry {
	t.Helper()
	return newDistributionAt(t, t.TempDir())
}

// newDistributionAt starts CNCF distribution v3 storing under root.
func newDistributionAt(t testing.TB, root string) *registry {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return serve(t, handlers.NewApp(ctx, distributionConfig(root)))
}

// newGGCR starts go-containerregistry's in-memory registry.
func newGGCR(t testing.TB) *registry {
	t.Helper()
	return serve(t, ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0))))
}

// newGGCRReferrers starts go-containerregistry's in-memory registry with
// the OCI 1.1 referrers API (newGGCR's answers it 404).
func newGGCRReferrers(t testing.TB) *registry {
	t.Helper()
	return serve(t, ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithReferrersSupport(true)))
}

func serve(t testing.TB, h http.Handler) *registry {
	r := &registry{stats: newStats(), corrupt: map[string]bool{}}
	r.srv = httptest.NewServer(r.middleware(h)) // listens on 127.0.0.1
	t.Cleanup(r.srv.Close)
	r.URL = r.srv.URL
	r.Host = strings.TrimPrefix(r.URL, "http://")
	return r
}

// Stats returns a copy of the counters.
func (r *registry) Stats() stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.Requests = map[string]int{}
	for k, v := range r.stats.Requests {
		s.Requests[k] = v
	}
	s.BlobGets = map[string]int{}
	for k, v := range r.stats.BlobGets {
		s.BlobGets[k] = v
	}
	return s
}

// Settle waits until the registry has served and received no blob bytes
// for a while (bounded), so that a client's transfers in flight (a mount's
// readahead, the body a killed push had already sent) are not counted
// after a ResetStats that follows.
func (r *registry) Settle(t *testing.T) {
	t.Helper()
	moved := func() int64 { st := r.Stats(); return st.BlobBytesOut + st.BlobBytesIn }
	last, quiet := moved(), 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && quiet < 3; {
		time.Sleep(100 * time.Millisecond)
		if n := moved(); n == last {
			quiet++
		} else {
			last, quiet = n, 0
		}
	}
}

// ResetStats zeroes the counters.
func (r *registry) ResetStats() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats = newStats()
}

// Corrupt makes every later blob GET of digest serve a body with a flipped byte.
func (r *registry) Corrupt(digest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.corrupt[digest] = true
}

// Uncorrupt undoes Corrupt.
func (r *registry) Uncorrupt(digest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.corrupt, digest)
}

var pathRE = regexp.MustCompile(`^/v2/(.+)/(blobs/uploads|blobs|manifests|tags)(/.*)?$`)

// classify names the kind of a registry API path and, for blobs, the digest.
func classify(path string) (kind, digest string) {
	if path == "/v2/" || path == "/v2" {
		return "base", ""
	}
	m := pathRE.FindStringSubmatch(path)
	if m == nil {
		return "other", ""
	}
	switch m[2] {
	case "blobs/uploads":
		return "upload", ""
	case "blobs":
		return "blob", strings.TrimPrefix(m[3], "/")
	case "manifests":
		return "manifest", ""
	default:
		return "tags", ""
	}
}

func (r *registry) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		kind, digest := classify(req.URL.Path)
		r.mu.Lock()
		r.stats.Requests[req.Method+" "+kind]++
		flip := kind == "blob" && req.Method == http.MethodGet && r.corrupt[digest]
		if kind == "blob" && req.Method == http.MethodGet {
			r.stats.BlobGets[digest]++
		}
		r.mu.Unlock()

		if kind == "upload" && req.Body != nil {
			req.Body = &countingBody{ReadCloser: req.Body, r: r}
		}
		if kind == "blob" && req.Method == http.MethodGet {
			w = &blobWriter{ResponseWriter: w, r: r, flip: flip}
		}
		next.ServeHTTP(w, req)
	})
}

type countingBody struct {
	io.ReadCloser
	r *registry
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.r.mu.Lock()
	b.r.stats.BlobBytesIn += int64(n)
	b.r.mu.Unlock()
	return n, err
}

// blobWriter counts a blob GET's body and, when flip is set, inverts the
// first byte of the body (of whatever range was asked for).
type blobWriter struct {
	http.ResponseWriter
	r       *registry
	flip    bool
	written int64
}

func (w *blobWriter) Write(p []byte) (int, error) {
	if w.flip && w.written == 0 && len(p) > 0 {
		q := append([]byte(nil), p...)
		q[0] ^= 0xff
		p = q
	}
	n, err := w.ResponseWriter.Write(p)
	w.written += int64(n)
	w.r.mu.Lock()
	w.r.stats.BlobBytesOut += int64(n)
	w.r.mu.Unlock()
	return n, err
}

func (w *blobWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *blobWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
