package e2e

import (
	"bytes"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// bodyCounter counts the bytes of object bodies a fake store serves (GETs
// that are not listings), per key.
type bodyCounter struct {
	mu    sync.Mutex
	bytes map[string]int64
}

// wrap counts the bodies h serves for requests isBody accepts.
func (c *bodyCounter) wrap(h http.Handler, isBody func(*http.Request) (string, bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := isBody(r)
		if !ok || r.Method != http.MethodGet {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(&countingWriter{ResponseWriter: w, add: func(n int) {
			c.mu.Lock()
			c.bytes[key] += int64(n)
			c.mu.Unlock()
		}}, r)
	})
}

// take returns the bytes served per key since the last call.
func (c *bodyCounter) take() (map[string]int64, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, total := c.bytes, int64(0)
	for _, n := range out {
		total += n
	}
	c.bytes = map[string]int64{}
	return out, total
}

type countingWriter struct {
	http.ResponseWriter
	add func(int)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.add(n)
	return n, err
}

// syncStoreFiles is a checkpoint of large and small files under a prefix.
func syncStoreFiles() map[string][]byte {
	return map[string][]byte{
		"model-00001.bin": randBytes(301, 6<<20+17),
		"model-00002.bin": randBytes(302, 5<<20+3),
		"config.json":     []byte(`{"layers":2,"hidden":64}`),
		"tokenizer.json":  randBytes(303, 40<<10),
	}
}

// syncResync runs the scenario both stores share: a first sync reads
// everything, an unchanged re-sync reads no byte of content and seals the
// same version, and after change rewrites one object a sync reads that
// object's bytes and nothing else, and the version pulls back bit for bit.
func syncResync(t *testing.T, src string, files map[string][]byte, bodies *bodyCounter, change func(key string, b []byte)) {
	t.Helper()
	reg := newDistribution(t)
	repo := reg.Host + "/team/store-resync"
	var all int64
	for _, b := range files {
		all += int64(len(b))
	}
	first := mustRun(t, "sync", src, repo+":v1").lastLine()
	if _, n := bodies.take(); n < all {
		t.Fatalf("premise: the first sync reads every file: %d bytes served of %d", n, all)
	}
	start := time.Now()
	res := mustRun(t, "sync", "--json", src, repo+":v1")
	secs := time.Since(start).Seconds()
	per, n := bodies.take()
	var out struct {
		Reference      string `json:"reference"`
		FilesUnchanged int    `json:"files_unchanged"`
		BytesUploaded  int64  `json:"bytes_uploaded"`
	}
	mustJSON(t, []byte(res.lastLine()), &out)
	t.Logf("unchanged re-sync of %d bytes: %d bytes of content read, %d files unchanged, %d bytes uploaded, %.2fs", all, n, out.FilesUnchanged, out.BytesUploaded, secs)
	if n != 0 || out.Reference != first || out.FilesUnchanged != len(files) {
		t.Errorf("unchanged re-sync read %v (%d bytes), sealed %s after %s, %d files unchanged; want 0 bytes, the same version, %d unchanged",
			per, n, out.Reference, first, out.FilesUnchanged, len(files))
	}

	changed := randBytes(404, len(files["model-00002.bin"])) // same size: only the store's identifier tells
	files["model-00002.bin"] = changed
	change("model-00002.bin", changed)
	res = mustRun(t, "sync", "--json", src, repo+":v2")
	per, n = bodies.take()
	mustJSON(t, []byte(res.lastLine()), &out)
	t.Logf("re-sync with one object of %d bytes rewritten: read %v", len(changed), per)
	if len(per) != 1 || per["model-00002.bin"] != int64(len(changed)) || out.FilesUnchanged != len(files)-1 {
		t.Errorf("re-sync with model-00002.bin rewritten read %v, %d files unchanged; want %d bytes of that object only, %d unchanged",
			per, out.FilesUnchanged, len(changed), len(files)-1)
	}
	syncCheckTree(t, out.Reference, files)
}

// A re-sync of an S3 prefix (gofakes3, through the AWS SDK) reads no
// object body when the listing gives every object the size, ETag and
// last-modified time the previous version recorded, and reads exactly the
// one object rewritten since (same size, new ETag and time).
func TestSyncS3ResyncReadsOnlyRewrittenObjects(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket("ckpt"); err != nil {
		t.Fatal(err)
	}
	files := syncStoreFiles()
	put := func(key string, b []byte) {
		if _, err := backend.PutObject("ckpt", "run1/"+key, map[string]string{}, bytes.NewReader(b), int64(len(b)), nil); err != nil {
			t.Fatal(err)
		}
	}
	for k, b := range files {
		put(k, b)
	}
	bodies := s3Endpoint(t, backend, "/ckpt/run1/")
	syncResync(t, "s3://ckpt/run1", files, bodies, func(key string, b []byte) {
		time.Sleep(2 * time.Millisecond) // a new last-modified time, as any rewrite has
		put(key, b)
	})
}

// s3Endpoint serves backend over the S3 API (gofakes3) as the CLI's
// AWS_ENDPOINT_URL, with test credentials, and counts the object bodies
// served under the path prefix.
func s3Endpoint(t *testing.T, backend gofakes3.Backend, prefix string) *bodyCounter {
	t.Helper()
	bodies := &bodyCounter{bytes: map[string]int64{}}
	srv := httptest.NewServer(bodies.wrap(gofakes3.New(backend).Server(), func(r *http.Request) (string, bool) {
		key, ok := strings.CutPrefix(r.URL.Path, prefix)
		return key, ok && key != ""
	}))
	t.Cleanup(srv.Close)
	syncEnv(t, nil)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAE2ETEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", syncAWSSecret)
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_ENDPOINT_URL", srv.URL)
	return bodies
}

// fakeGCSStore is the GCS JSON API as a sync uses it (listing by prefix in
// pages of two, media downloads with Range, pinned to a generation) over
// objects whose generation grows with every write, as GCS's does.
type fakeGCSStore struct {
	mu      sync.Mutex
	objects map[string][]byte
	gens    map[string]int64
	next    int64
}

func (f *fakeGCSStore) put(name string, b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	f.objects[name], f.gens[name] = b, 1700000000000000+f.next
}

func (f *fakeGCSStore) resource(n string) map[string]string {
	sum := md5.Sum(f.objects[n])
	return map[string]string{"kind": "storage#object", "name": n, "bucket": "b", "size": strconv.Itoa(len(f.objects[n])),
		"generation": strconv.FormatInt(f.gens[n], 10), "md5Hash": base64.StdEncoding.EncodeToString(sum[:])}
}

func (f *fakeGCSStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	const list = "/storage/v1/b/b/o"
	if r.URL.Path == list {
		var names []string
		for n := range f.objects {
			if strings.HasPrefix(n, r.URL.Query().Get("prefix")) {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		start, _ := strconv.Atoi(r.URL.Query().Get("pageToken"))
		end := min(len(names), start+2)
		page := map[string]any{"kind": "storage#objects"}
		items := []map[string]string{}
		for _, n := range names[start:end] {
			items = append(items, f.resource(n))
		}
		page["items"] = items
		if end < len(names) {
			page["nextPageToken"] = strconv.Itoa(end)
		}
		json.NewEncoder(w).Encode(page)
		return
	}
	name, _ := url.PathUnescape(strings.TrimPrefix(r.URL.Path, list+"/"))
	b, ok := f.objects[name]
	if !ok || r.URL.Query().Get("alt") != "media" {
		http.Error(w, `{"error":{"code":404}}`, http.StatusNotFound)
		return
	}
	if g := r.URL.Query().Get("generation"); g != "" && g != strconv.FormatInt(f.gens[name], 10) {
		http.Error(w, fmt.Sprintf(`{"error":{"code":404,"message":"no generation %s"}}`, g), http.StatusNotFound)
		return
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}

// A re-sync of a GCS prefix reads no object when every object has the
// size, generation and MD5 the previous version recorded, and reads
// exactly the one object rewritten since (a new generation).
func TestSyncGCSResyncReadsOnlyRewrittenObjects(t *testing.T) {
	store := &fakeGCSStore{objects: map[string][]byte{}, gens: map[string]int64{}}
	files := syncStoreFiles()
	for k, b := range files {
		store.put("run1/"+k, b)
	}
	bodies := &bodyCounter{bytes: map[string]int64{}}
	srv := httptest.NewServer(bodies.wrap(store, func(r *http.Request) (string, bool) {
		key, ok := strings.CutPrefix(r.URL.Path, "/storage/v1/b/b/o/run1/")
		return key, ok && r.URL.Query().Get("alt") == "media"
	}))
	t.Cleanup(srv.Close)
	syncEnv(t, nil)
	t.Setenv("STORAGE_EMULATOR_HOST", srv.URL)
	syncResync(t, "gs://b/run1", files, bodies, func(key string, b []byte) { store.put("run1/"+key, b) })
}
