package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// faultConfig selects the faults a faultProxy injects. The zero value
// injects none.
type faultConfig struct {
	Fail503Every    int             // answer every Nth request with 503 (0: never)
	TooMany429Every int             // answer every Nth request with 429 and Retry-After: 1 (0: never)
	CutFirstBlobGET bool            // close the connection half-way through the first GET of each blob
	FlipFirstGET    bool            // flip a byte in the body of the first GET of each blob
	FlipDigests     map[string]bool // flip a byte in the body of every GET of these blobs
	NoRange         bool            // ignore Range: answer 200 with the whole blob
	MaxBody         int64           // answer 413 to upload bodies (POST/PUT/PATCH) over this size (0: no limit)
	DownAfter       int             // answer 503 to every request after the Nth (0: never)
	// RefuseManifestPutsAfter answers 400 MANIFEST_INVALID to every manifest
	// PUT after the Nth (0: never).
	RefuseManifestPutsAfter int
}

// faultProxy is a reverse proxy in front of a registry that injects the
// faults of its faultConfig, deterministically, and counts what it injected.
type faultProxy struct {
	Host   string // 127.0.0.1:port, plain HTTP like every loopback registry
	target *url.URL
	tr     *http.Transport

	mu       sync.Mutex
	cfg      faultConfig
	n        int            // requests seen
	gets     map[string]int // blob GETs seen, by digest
	puts     int            // manifest PUTs seen
	injected map[string]int // faults injected, by kind
}

// newFaultProxy starts a fault proxy in front of reg, injecting nothing yet.
func newFaultProxy(t testing.TB, reg *registry) *faultProxy {
	t.Helper()
	u, err := url.Parse(reg.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{
		target:   u,
		tr:       &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
		gets:     map[string]int{},
		injected: map[string]int{},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p}
	go srv.Serve(l)
	t.Cleanup(func() {
		srv.Close()
		p.tr.CloseIdleConnections()
	})
	p.Host = l.Addr().String()
	return p
}

// Set replaces the faults to inject and zeroes the per-blob GET counts.
func (p *faultProxy) Set(cfg faultConfig) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg = cfg
	p.gets = map[string]int{}
	p.n, p.puts = 0, 0
}

// Injected returns a copy of the counts of injected faults, by kind: 503,
// 429, cut, flip, range (a Range header dropped), 413, down and manifest-put.
func (p *faultProxy) Injected() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]int{}
	for k, v := range p.injected {
		m[k] = v
	}
	return m
}

// Requests is the number of requests the proxy has seen.
func (p *faultProxy) Requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind, digest := classify(r.URL.Path)
	blobGET := kind == "blob" && r.Method == http.MethodGet
	upload := kind == "upload" && (r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch)

	p.mu.Lock()
	cfg := p.cfg
	p.n++
	n := p.n
	var nth int
	if blobGET {
		p.gets[digest]++
		nth = p.gets[digest]
	}
	inject := func(k string) { p.injected[k]++ }
	if kind == "manifest" && r.Method == http.MethodPut {
		p.puts++
	}
	switch {
	case cfg.DownAfter > 0 && n > cfg.DownAfter:
		inject("down")
		p.mu.Unlock()
		http.Error(w, "injected fault: down", http.StatusServiceUnavailable)
		return
	case cfg.RefuseManifestPutsAfter > 0 && kind == "manifest" && r.Method == http.MethodPut && p.puts > cfg.RefuseManifestPutsAfter:
		inject("manifest-put")
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"errors":[{"code":"MANIFEST_INVALID","message":"injected fault: manifest refused"}]}`)
		return
	case cfg.Fail503Every > 0 && n%cfg.Fail503Every == 0:
		inject("503")
		p.mu.Unlock()
		http.Error(w, "injected fault: 503", http.StatusServiceUnavailable)
		return
	case cfg.TooMany429Every > 0 && n%cfg.TooMany429Every == 0:
		inject("429")
		p.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		http.Error(w, "injected fault: 429", http.StatusTooManyRequests)
		return
	}
	cut := cfg.CutFirstBlobGET && blobGET && nth == 1
	flip := blobGET && (cfg.FlipDigests[digest] || (cfg.FlipFirstGET && nth == 1))
	if cfg.NoRange && r.Header.Get("Range") != "" {
		inject("range")
		r.Header.Del("Range")
		r.Header.Del("If-Range")
	}
	p.mu.Unlock()

	if upload && cfg.MaxBody > 0 {
		too := r.ContentLength > cfg.MaxBody
		if !too && r.ContentLength < 0 && r.Body != nil {
			b, err := io.ReadAll(io.LimitReader(r.Body, cfg.MaxBody+1))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			too = int64(len(b)) > cfg.MaxBody
			r.Body = io.NopCloser(bytes.NewReader(b))
			r.ContentLength = int64(len(b))
		}
		if too {
			p.mu.Lock()
			inject("413")
			p.mu.Unlock()
			w.Header().Set("Connection", "close")
			http.Error(w, "injected fault: request body over "+strconv.FormatInt(cfg.MaxBody, 10)+" bytes", http.StatusRequestEntityTooLarge)
			return
		}
	}

	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme = p.target.Scheme
	out.URL.Host = p.target.Host
	// out.Host stays the proxy's, so that the registry's Location headers
	// send the client back through the proxy.
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	if r.ContentLength == 0 {
		out.Body = nil
	}
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		http.Error(w, "fault proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	for _, h := range hopHeaders {
		w.Header().Del(h)
	}
	if cfg.NoRange {
		w.Header().Del("Accept-Ranges")
	}
	if r.Method == http.MethodHead || !(cut || flip) || resp.StatusCode >= 300 {
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
		return
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if flip && len(body) > 0 {
		body[len(body)/2] ^= 0x01
		p.mu.Lock()
		inject("flip")
		p.mu.Unlock()
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(resp.StatusCode)
	if cut && len(body) > 1 {
		p.mu.Lock()
		inject("cut")
		p.mu.Unlock()
		w.Write(body[:len(body)/2])
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the client sees the connection close short of Content-Length
	}
	w.Write(body)
}

// checkCleanFailure fails the test unless res is a clean failure: a non-zero
// exit and a last line on stderr that is the CLI's one-line error, with no
// panic or stack trace.
func checkCleanFailure(t testing.TB, res result) string {
	t.Helper()
	if res.code == 0 {
		t.Errorf("expected a failure:\n%s", res)
		return ""
	}
	lines := strings.Split(strings.TrimRight(res.stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "bdnvol: ") || len(last) < len("bdnvol: ")+10 {
		t.Errorf("the last line of stderr is not a clear error:\n%s", res)
	}
	t.Logf("error: %s", last)
	for _, bad := range []string{"panic:", "goroutine ", "runtime error"} {
		if strings.Contains(res.stderr, bad) {
			t.Errorf("stderr has %q:\n%s", bad, res)
		}
	}
	return last
}

// checkNoWrongFile fails the test if dst has a file under a final name of
// src whose contents differ, or anything that is neither in src nor in the
// pull's private directory of temporary files.
func checkNoWrongFile(t testing.TB, src, dst string) {
	t.Helper()
	if _, err := os.Stat(dst); errors.Is(err, os.ErrNotExist) {
		return
	}
	want := snapshot(t, src)
	for p, g := range snapshot(t, dst) {
		w, ok := want[p]
		switch {
		case !ok && strings.HasPrefix(p, ".bdnvol-pull"): // the pull's private directory, for a re-run
		case !ok:
			t.Errorf("after a failed pull: unexpected %q (%v)", p, g)
		case g.Type == "file" && (w.Type != "file" || g.SHA != w.SHA || g.Size != w.Size):
			t.Errorf("after a failed pull: %q is under its final name with the wrong contents: %v, want %v", p, g, w)
		}
	}
}

// listTags lists the tags of a repository, straight from the registry.
func listTags(t testing.TB, reg *registry, name string) []string {
	t.Helper()
	resp, err := http.Get(reg.URL + "/v2/" + name + "/tags/list")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET tags of %s: %s %s", name, resp.Status, body)
	}
	var tl struct {
		Tags []string `json:"tags"`
	}
	if err := json.Unmarshal(body, &tl); err != nil {
		t.Fatalf("tags of %s: %v", name, err)
	}
	sort.Strings(tl.Tags)
	return tl.Tags
}

// checkTagsWhole pulls every volume tag of the repository straight from the
// registry and compares it with src, the only tree ever pushed there; history
// records are not volumes. It returns the digests the tags point at.
func checkTagsWhole(t testing.TB, reg *registry, name, src string) map[string]string {
	t.Helper()
	digests := map[string]string{}
	for _, tag := range listTags(t, reg, name) {
		if strings.HasPrefix(tag, "history-") {
			continue
		}
		dst := filepath.Join(t.TempDir(), "tag-"+tag)
		res := run(t, "pull", "--json", reg.Host+"/"+name+":"+tag, dst)
		if res.code != 0 {
			t.Errorf("tag %s points at a version that does not pull:\n%s", tag, res)
			continue
		}
		compareTrees(t, src, dst)
		var out struct {
			Digest string `json:"digest"`
		}
		mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &out)
		digests[tag] = out.Digest
	}
	return digests
}

// tryMount mounts ref on a new directory with --daemon and returns the
// mountpoint and the result; the mount is removed in t.Cleanup.
func tryMount(t *testing.T, ref string, flags ...string) (string, result) {
	t.Helper()
	requireFUSE(t)
	mp := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forceUnmount(t, mp) })
	args := append([]string{"mount", "--daemon"}, flags...)
	return mp, run(t, append(args, ref, mp)...)
}

// readThroughMount reads every regular file of src through the mount at mp:
// each read must give the source's bytes or EIO. It returns the files that
// gave EIO.
func readThroughMount(t *testing.T, src, mp string) []string {
	t.Helper()
	var eio []string
	want := snapshot(t, src)
	paths := make([]string, 0, len(want))
	for p := range want {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if want[p].Type != "file" {
			continue
		}
		got, err := os.ReadFile(filepath.Join(mp, filepath.FromSlash(p)))
		switch {
		case errors.Is(err, syscall.EIO):
			eio = append(eio, p)
		case err != nil:
			t.Errorf("reading %s through the mount: %v, want the bytes or EIO", p, err)
		case !bytes.Equal(got, fileContents(t, filepath.Join(src, filepath.FromSlash(p)))):
			t.Errorf("reading %s through the mount gave wrong bytes", p)
		}
	}
	return eio
}
