package source

import (
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeHub speaks the Hub's API (revision, paginated recursive tree,
// resolve) and redirects LFS files to a separate CDN server that serves
// Range requests, as huggingface.co does.
type fakeHub struct {
	hub, cdn *httptest.Server
	commit   string
	files    map[string][]byte // what the repository holds
	served   map[string][]byte // what the CDN and resolve serve, when different
	lfs      map[string]bool
	pageSize int
	cdnBase  string // where LFS files redirect to, when not the CDN server

	mu       sync.Mutex
	hubAuth  []string // Authorization headers the Hub saw
	cdnAuth  []string // Authorization headers the CDN saw
	cdnGets  int
	revCalls []string
}

func newFakeHub(t *testing.T, files map[string][]byte, lfs map[string]bool) *fakeHub {
	f := &fakeHub{commit: strings.Repeat("ab", 20), files: files, served: map[string][]byte{}, lfs: lfs, pageSize: 2}
	f.cdn = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.cdnAuth = append(f.cdnAuth, r.Header.Get("Authorization"))
		f.cdnGets++
		f.mu.Unlock()
		if r.URL.Query().Get("sig") != "secret-signature" {
			http.Error(w, "bad signature", http.StatusForbidden)
			return
		}
		p := strings.TrimPrefix(r.URL.Path, "/blobs/")
		http.ServeContent(w, r, p, time.Time{}, bytes.NewReader(f.content(p)))
	}))
	f.hub = httptest.NewServer(http.HandlerFunc(f.serveHub))
	t.Cleanup(f.cdn.Close)
	t.Cleanup(f.hub.Close)
	return f
}

func (f *fakeHub) content(p string) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.served[p]; ok {
		return b
	}
	return f.files[p]
}

func (f *fakeHub) serveHub(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.hubAuth = append(f.hubAuth, r.Header.Get("Authorization"))
	f.mu.Unlock()
	path := r.URL.Path
	for _, kind := range []string{"models", "datasets"} {
		if rest, ok := strings.CutPrefix(path, "/api/"+kind+"/org/repo/"); ok {
			switch {
			case strings.HasPrefix(rest, "revision/"):
				rev := strings.TrimPrefix(rest, "revision/")
				f.mu.Lock()
				f.revCalls = append(f.revCalls, kind+":"+rev)
				f.mu.Unlock()
				if rev != "main" && rev != f.commit {
					http.Error(w, `{"error":"Invalid rev id"}`, http.StatusNotFound)
					return
				}
				json.NewEncoder(w).Encode(map[string]any{"id": "org/repo", "sha": f.commit})
			case rest == "tree/"+f.commit:
				f.serveTree(w, r)
			default:
				http.NotFound(w, r)
			}
			return
		}
	}
	prefix := "/org/repo/resolve/" + f.commit + "/"
	if strings.HasPrefix(path, "/datasets/") {
		prefix = "/datasets" + prefix
	}
	p, ok := strings.CutPrefix(path, prefix)
	if _, exists := f.files[p]; !ok || !exists {
		http.NotFound(w, r)
		return
	}
	if f.lfs[p] {
		base := f.cdn.URL
		if f.cdnBase != "" {
			base = f.cdnBase
		}
		http.Redirect(w, r, base+"/blobs/"+p+"?sig=secret-signature", http.StatusFound)
		return
	}
	http.ServeContent(w, r, p, time.Time{}, bytes.NewReader(f.content(p)))
}

// serveTree lists every file and directory, pageSize entries per page,
// with a Link header to the next page.
func (f *fakeHub) serveTree(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("recursive") != "true" {
		http.Error(w, "want recursive", http.StatusBadRequest)
		return
	}
	var entries []map[string]any
	dirs := map[string]bool{}
	for p, b := range f.files {
		for d := parent(p); d != ""; d = parent(d) {
			dirs[d] = true
		}
		e := map[string]any{"type": "file", "path": p, "size": len(b), "oid": gitBlobID(b)}
		if f.lfs[p] {
			sum := sha256.Sum256(b)
			e["size"] = 134 // the pointer's size
			e["lfs"] = map[string]any{"oid": hex.EncodeToString(sum[:]), "size": len(b), "pointerSize": 134}
		}
		entries = append(entries, e)
	}
	for d := range dirs {
		entries = append(entries, map[string]any{"type": "directory", "path": d, "size": 0, "oid": strings.Repeat("0", 40)})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i]["path"].(string) < entries[j]["path"].(string) })
	start, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
	end := min(len(entries), start+f.pageSize)
	if end < len(entries) {
		next := *r.URL
		q := next.Query()
		q.Set("cursor", strconv.Itoa(end))
		next.RawQuery = q.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s>; rel="next"`, next.String()))
	}
	json.NewEncoder(w).Encode(entries[start:end])
}

func gitBlobID(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// fakeGCS speaks the parts of the GCS JSON API a sync uses: object
// listing by prefix with pages, and media downloads with Range.
type fakeGCS struct {
	srv     *httptest.Server
	objects map[string][]byte // bucket "b"
	served  map[string][]byte
}

func newFakeGCS(t *testing.T, objects map[string][]byte) *fakeGCS {
	f := &fakeGCS{objects: objects, served: map[string][]byte{}}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const list = "/storage/v1/b/b/o"
		if r.URL.Path == list {
			prefix := r.URL.Query().Get("prefix")
			var names []string
			for n := range f.objects {
				if strings.HasPrefix(n, prefix) {
					names = append(names, n)
				}
			}
			sort.Strings(names)
			start, _ := strconv.Atoi(r.URL.Query().Get("pageToken"))
			end := min(len(names), start+2)
			resp := map[string]any{"kind": "storage#objects"}
			var items []map[string]any
			for _, n := range names[start:end] {
				items = append(items, f.resource(n))
			}
			resp["items"] = items
			if end < len(names) {
				resp["nextPageToken"] = strconv.Itoa(end)
			}
			json.NewEncoder(w).Encode(resp)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, list+"/")
		b, exists := f.objects[name]
		if !ok || !exists {
			http.Error(w, `{"error":{"code":404}}`, http.StatusNotFound)
			return
		}
		if r.URL.Query().Get("alt") != "media" {
			json.NewEncoder(w).Encode(f.resource(name))
			return
		}
		if r.URL.Query().Get("generation") != "7" {
			http.Error(w, "wrong generation", http.StatusNotFound)
			return
		}
		if s, ok := f.served[name]; ok {
			b = s
		}
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeGCS) resource(n string) map[string]any {
	sum := md5.Sum(f.objects[n])
	return map[string]any{"name": n, "bucket": "b", "size": strconv.Itoa(len(f.objects[n])), "generation": "7",
		"md5Hash": base64.StdEncoding.EncodeToString(sum[:])}
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}
