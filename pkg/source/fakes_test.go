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
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	cdnBase  string           // where LFS files redirect to, when not the CDN server
	sizes    map[string]int64 // sizes the tree lists instead of the real ones
	// paging "loop" links the second tree page to itself; "endless" links
	// every page to a new one.
	paging    string
	treePages atomic.Int64

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
	f.treePages.Add(1)
	switch f.paging {
	case "loop":
		next := *r.URL
		q := next.Query()
		q.Set("cursor", "2")
		next.RawQuery = q.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s>; rel="next"`, next.String()))
		fmt.Fprint(w, "[]")
		return
	case "endless":
		n, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
		w.Header().Set("Link", fmt.Sprintf(`<%s?recursive=true&cursor=%d>; rel="next"`, r.URL.Path, n+1))
		fmt.Fprint(w, "[]")
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
		if n, ok := f.sizes[p]; ok {
			e["size"] = n
			if lfs, ok := e["lfs"].(map[string]any); ok {
				lfs["size"] = n
			}
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
	srv       *httptest.Server
	objects   map[string][]byte // bucket "b"
	served    map[string][]byte
	loop      bool // every page names the same next page token
	listPages atomic.Int64
}

func newFakeGCS(t *testing.T, objects map[string][]byte) *fakeGCS {
	f := &fakeGCS{objects: objects, served: map[string][]byte{}}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const list = "/storage/v1/b/b/o"
		if r.URL.Path == list {
			f.listPages.Add(1)
			if f.loop {
				fmt.Fprint(w, `{"kind":"storage#objects","nextPageToken":"again"}`)
				return
			}
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

// fakeS3 answers ListObjectsV2 (path-style, bucket "b") with the objects
// given, one page each, and then a page that names itself as the next one
// when loop is set.
type fakeS3 struct {
	srv       *httptest.Server
	sizes     map[string]int64 // key -> listed size
	loop      bool
	listPages atomic.Int64
	redirect  string // where GETs of objects are redirected
}

func newFakeS3(t *testing.T, sizes map[string]int64) *fakeS3 {
	f := &fakeS3{sizes: sizes}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.redirect != "" && strings.HasPrefix(r.URL.Path, "/b/") && len(r.URL.Path) > 3 {
			http.Redirect(w, r, f.redirect, http.StatusTemporaryRedirect)
			return
		}
		if r.URL.Path != "/b" && r.URL.Path != "/b/" || r.URL.Query().Get("list-type") != "2" {
			http.Error(w, "<Error><Code>NoSuchKey</Code></Error>", http.StatusNotFound)
			return
		}
		f.listPages.Add(1)
		w.Header().Set("Content-Type", "application/xml")
		var b strings.Builder
		b.WriteString(`<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name>`)
		if f.loop {
			b.WriteString(`<IsTruncated>true</IsTruncated><NextContinuationToken>same-token</NextContinuationToken>`)
		} else {
			b.WriteString(`<IsTruncated>false</IsTruncated>`)
		}
		keys := make([]string, 0, len(f.sizes))
		for k := range f.sizes {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, `<Contents><Key>%s</Key><Size>%d</Size></Contents>`, k, f.sizes[k])
		}
		b.WriteString(`</ListBucketResult>`)
		fmt.Fprint(w, b.String())
	}))
	t.Cleanup(f.srv.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIATEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	// A path under a fresh directory is missing on any machine; /nonexistent
	// is a directory on some (the home of system users).
	missing := filepath.Join(t.TempDir(), "missing")
	t.Setenv("AWS_CONFIG_FILE", missing)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", missing)
	t.Setenv("AWS_ENDPOINT_URL", "")
	return f
}
