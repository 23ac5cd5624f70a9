package e2e

import (
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

const (
	syncHFToken   = "hf_e2e_secret_token_123"
	syncAWSSecret = "e2e-aws-secret-key-456"
)

// syncHub is a local Hugging Face Hub: the revision and paginated tree API,
// and resolve, which redirects LFS files to a separate CDN server that
// serves Range requests, as huggingface.co does.
type syncHub struct {
	hub, cdn *httptest.Server
	commit   string
	files    map[string][]byte
	lfs      map[string]bool

	mu           sync.Mutex
	cut          int                      // the CDN cuts this many more responses half-way
	fail503      int                      // and answers 503 to this many more requests
	served       map[string][]byte        // bytes served instead of files[p]
	gates        map[string]chan struct{} // the CDN holds requests for p until closed
	cdnAuth      []string                 // Authorization headers the CDN saw
	contentBytes int64                    // bytes of file content the Hub and the CDN served
}

func newSyncHub(t *testing.T, files map[string][]byte, lfs map[string]bool) *syncHub {
	t.Helper()
	h := &syncHub{commit: "0123456789abcdef0123456789abcdef01234567", files: files, lfs: lfs,
		served: map[string][]byte{}, gates: map[string]chan struct{}{}}
	h.cdn = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := strings.TrimPrefix(r.URL.Path, "/repos/")
		h.mu.Lock()
		h.cdnAuth = append(h.cdnAuth, r.Header.Get("Authorization"))
		gate := h.gates[p]
		h.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		if r.URL.Query().Get("X-Amz-Signature") == "" {
			http.Error(w, "unsigned", http.StatusForbidden)
			return
		}
		h.mu.Lock()
		fail, cut := h.fail503 > 0, h.fail503 == 0 && h.cut > 0
		if fail {
			h.fail503--
		} else if cut {
			h.cut--
		}
		h.mu.Unlock()
		if fail {
			http.Error(w, "slow down", http.StatusServiceUnavailable)
			return
		}
		if cut {
			w = &cuttingWriter{ResponseWriter: w}
		}
		http.ServeContent(&contentCounter{w, h}, r, p, time.Time{}, bytes.NewReader(h.content(p)))
	}))
	h.hub = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(func() {
		h.mu.Lock()
		for p, g := range h.gates {
			close(g)
			delete(h.gates, p)
		}
		h.mu.Unlock()
		h.cdn.Close()
		h.hub.Close()
	})
	return h
}

func (h *syncHub) content(p string) []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b, ok := h.served[p]; ok {
		return b
	}
	return h.files[p]
}

// hold makes the CDN hold every request for p until release.
func (h *syncHub) hold(p string) (release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := make(chan struct{})
	h.gates[p] = g
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.gates[p] == g {
			close(g)
			delete(h.gates, p)
		}
	}
}

func (h *syncHub) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+syncHFToken {
		http.Error(w, `{"error":"Invalid credentials"}`, http.StatusUnauthorized)
		return
	}
	switch p := r.URL.Path; {
	case p == "/api/models/org/model/revision/main":
		json.NewEncoder(w).Encode(map[string]any{"id": "org/model", "sha": h.commit})
	case p == "/api/models/org/model/tree/"+h.commit:
		h.serveTree(w, r)
	case strings.HasPrefix(p, "/org/model/resolve/"+h.commit+"/"):
		f := strings.TrimPrefix(p, "/org/model/resolve/"+h.commit+"/")
		if _, ok := h.files[f]; !ok {
			http.NotFound(w, r)
			return
		}
		if h.lfs[f] {
			http.Redirect(w, r, h.cdn.URL+"/repos/"+f+"?X-Amz-Signature=cdn-signature-789&Expires=9", http.StatusFound)
			return
		}
		http.ServeContent(&contentCounter{w, h}, r, f, time.Time{}, bytes.NewReader(h.content(f)))
	default:
		http.NotFound(w, r)
	}
}

// serveTree lists files two per page, linking to the next page.
func (h *syncHub) serveTree(w http.ResponseWriter, r *http.Request) {
	var paths []string
	for p := range h.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var start int
	fmt.Sscan(r.URL.Query().Get("cursor"), &start)
	end := min(len(paths), start+2)
	var out []map[string]any
	for _, p := range paths[start:end] {
		b := h.files[p]
		blob := sha1.New()
		fmt.Fprintf(blob, "blob %d\x00", len(b))
		blob.Write(b)
		e := map[string]any{"type": "file", "path": p, "size": len(b), "oid": hex.EncodeToString(blob.Sum(nil))}
		if h.lfs[p] {
			sum := sha256.Sum256(b)
			e["size"] = 135
			e["lfs"] = map[string]any{"oid": hex.EncodeToString(sum[:]), "size": len(b), "pointerSize": 135}
		}
		out = append(out, e)
	}
	if end < len(paths) {
		w.Header().Set("Link", fmt.Sprintf(`<%s/api/models/org/model/tree/%s?recursive=true&cursor=%d>; rel="next"`, h.hub.URL, h.commit, end))
	}
	json.NewEncoder(w).Encode(out)
}

// syncModel is the repository the Hub tests sync. zz-slow.bin sorts last,
// so holding it leaves the other files free to finish.
func syncModel() (map[string][]byte, map[string]bool) {
	files := map[string][]byte{
		"config.json":        []byte(`{"architectures":["Tiny"],"hidden_size":64}`),
		"README.md":          []byte("# tiny model\n"),
		"weights/a.bin":      randBytes(101, 3<<20+17),
		"weights/b.bin":      randBytes(102, 2<<20+5),
		"tokenizer/vocab.tx": randBytes(103, 5000),
		"zz-slow.bin":        randBytes(104, 2<<20+99),
	}
	lfs := map[string]bool{"weights/a.bin": true, "weights/b.bin": true, "zz-slow.bin": true}
	return files, lfs
}

// syncEnv points the CLI at the Hub and a fresh job directory; it returns
// the job directory.
func syncEnv(t *testing.T, h *syncHub) string {
	t.Helper()
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	if h != nil {
		t.Setenv("HF_ENDPOINT", h.hub.URL)
		t.Setenv("HF_TOKEN", syncHFToken)
	}
	jobsDir := filepath.Join(state, "bdnvol", "jobs")
	t.Cleanup(func() {
		// Stop any job process a failed test left running.
		for _, j := range syncJobs(t) {
			if j.PID > 0 {
				syscall.Kill(j.PID, syscall.SIGKILL)
			}
		}
	})
	return jobsDir
}

// syncJob is one element of jobs --json.
type syncJob struct {
	ID            string `json:"id"`
	Source        string `json:"source"`
	Destination   string `json:"destination"`
	State         string `json:"state"`
	Reason        string `json:"reason"`
	PID           int    `json:"pid"`
	Reference     string `json:"reference"`
	Commit        string `json:"commit"`
	BytesUploaded int64  `json:"bytes_uploaded"`
}

func syncJobs(t *testing.T) []syncJob {
	t.Helper()
	res := run(t, "jobs", "--json")
	var js []syncJob
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &js) != nil {
		t.Errorf("jobs --json:\n%s", res)
	}
	return js
}

func syncJobByID(t *testing.T, id string) syncJob {
	t.Helper()
	for _, j := range syncJobs(t) {
		if j.ID == id {
			return j
		}
	}
	t.Fatalf("job %s not listed", id)
	return syncJob{}
}

// syncCheckTree pulls ref and checks that it holds exactly files.
func syncCheckTree(t *testing.T, ref string, files map[string][]byte) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "out")
	pull(t, ref, dir)
	seen := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		want, ok := files[rel]
		if !ok {
			t.Errorf("pulled %s, which the source does not have", rel)
		} else if !bytes.Equal(b, want) {
			t.Errorf("%s: pulled %d bytes differ from the source's %d", rel, len(b), len(want))
		}
		seen[rel] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for p := range files {
		if !seen[p] {
			t.Errorf("%s is missing from the version", p)
		}
	}
}

// syncCheckNoSecrets fails when a secret appears in the job files or logs, or in
// the outputs given.
func syncCheckNoSecrets(t *testing.T, jobsDir string, outputs ...string) {
	t.Helper()
	secrets := []string{syncHFToken, syncAWSSecret, "cdn-signature-789"}
	entries, err := os.ReadDir(jobsDir)
	if err != nil || len(entries) == 0 {
		t.Fatalf("job directory %s: %v (%d entries)", jobsDir, err, len(entries))
	}
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(jobsDir, e.Name()))
		outputs = append(outputs, string(b))
	}
	for _, out := range outputs {
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Errorf("a credential (%s…) leaked into:\n%s", s[:6], out)
			}
		}
	}
}

var syncRefRE = regexp.MustCompile(`^(.+)@(sha256:[0-9a-f]{64})$`)

func TestSyncHubSealsTheSourceBitForBitAndResyncUploadsNothing(t *testing.T) {
	files, lfs := syncModel()
	h := newSyncHub(t, files, lfs)
	jobsDir := syncEnv(t, h)
	reg := newDistribution(t)
	repo := reg.Host + "/team/model"

	res := mustRun(t, "sync", "hf://org/model", repo+":v1", "--tag", "latest")
	m := syncRefRE.FindStringSubmatch(res.lastLine())
	if m == nil || m[1] != repo {
		t.Fatalf("last line %q, want %s@sha256:<hex>\n%s", res.lastLine(), repo, res)
	}
	ref := res.lastLine()
	syncCheckTree(t, ref, files)
	// The sealed version names its source and the commit it was taken at.
	var man struct {
		Annotations map[string]string `json:"annotations"`
	}
	body, _ := getManifest(t, reg, "team/model", m[2], "application/vnd.oci.image.manifest.v1+json")
	mustJSON(t, body, &man)
	if man.Annotations["io.bdnvol.source"] != "hf://org/model@main" || man.Annotations["io.bdnvol.source.revision"] != h.commit {
		t.Errorf("manifest annotations %v do not record the source and commit %s", man.Annotations, h.commit)
	}
	for _, tag := range []string{"v1", "latest"} {
		if got := mustRun(t, "resolve", repo+":"+tag).lastLine(); got != ref {
			t.Errorf("%s resolves to %s, want %s", tag, got, ref)
		}
	}
	h.mu.Lock()
	for _, a := range h.cdnAuth {
		if a != "" {
			t.Errorf("the CDN got an Authorization header")
		}
	}
	if len(h.cdnAuth) == 0 {
		t.Error("nothing came from the CDN")
	}
	h.mu.Unlock()
	js := syncJobs(t)
	if len(js) != 1 || js[0].State != "SUCCEEDED" || js[0].Reference != ref || js[0].Commit != h.commit {
		t.Fatalf("jobs: %+v", js)
	}
	logs := mustRun(t, "jobs", "logs", js[0].ID)
	if !strings.Contains(logs.stdout, h.commit) || !strings.Contains(logs.stdout, ref) {
		t.Errorf("the log does not name the commit and the reference:\n%s", logs)
	}

	reg.ResetStats()
	again := mustRun(t, "sync", "--json", "hf://org/model", repo+":v1")
	var out struct {
		Reference     string `json:"reference"`
		BytesUploaded int64  `json:"bytes_uploaded"`
		Commit        string `json:"commit"`
	}
	if err := json.Unmarshal([]byte(again.lastLine()), &out); err != nil {
		t.Fatalf("sync --json: %v\n%s", err, again)
	}
	if out.Reference != ref || out.BytesUploaded != 0 || out.Commit != h.commit {
		t.Errorf("re-sync: %+v, want %s with 0 bytes uploaded", out, ref)
	}
	if st := reg.Stats(); st.BlobBytesIn != 0 {
		t.Errorf("re-sync sent %d blob bytes to the registry", st.BlobBytesIn)
	}
	syncCheckNoSecrets(t, jobsDir, res.stdout, res.stderr, again.stdout, again.stderr, logs.stdout)
}

func TestSyncHubDigestMismatchFailsTheJobAndSealsNothing(t *testing.T) {
	files, lfs := syncModel()
	h := newSyncHub(t, files, lfs)
	bad := bytes.Clone(files["weights/b.bin"])
	bad[1<<20] ^= 0x40
	h.served["weights/b.bin"] = bad
	syncEnv(t, h)
	reg := newDistribution(t)
	repo := reg.Host + "/team/model"

	res := run(t, "sync", "hf://org/model", repo+":v1")
	if res.code == 0 {
		t.Fatalf("sync of a corrupt file succeeded:\n%s", res)
	}
	for _, want := range []string{"weights/b.bin", "hf://org/model", "sha256"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("stderr does not mention %q:\n%s", want, res)
		}
	}
	if n := reg.Stats().Requests["PUT manifest"]; n != 0 {
		t.Errorf("%d manifests were stored", n)
	}
	resp, err := http.Get(reg.URL + "/v2/team/model/tags/list")
	if err != nil {
		t.Fatal(err)
	}
	var tl struct{ Tags []string }
	json.NewDecoder(resp.Body).Decode(&tl)
	resp.Body.Close()
	if len(tl.Tags) != 0 {
		t.Errorf("tags after a failed sync: %v", tl.Tags)
	}
	js := syncJobs(t)
	if len(js) != 1 || js[0].State != "FAILED" || !strings.Contains(js[0].Reason, "weights/b.bin") {
		t.Fatalf("jobs: %+v", js)
	}
	if w := run(t, "jobs", "wait", js[0].ID); w.code == 0 || !strings.Contains(w.stderr, "weights/b.bin") {
		t.Errorf("jobs wait on a failed job:\n%s", w)
	}
}

func TestSyncDetachedJobKilledMidwayResumesUploadingOnlyWhatWasMissing(t *testing.T) {
	files, lfs := syncModel()
	h := newSyncHub(t, files, lfs)
	jobsDir := syncEnv(t, h)
	reg := newDistribution(t)
	repo := reg.Host + "/team/model"
	release := h.hold("zz-slow.bin")

	start := mustRun(t, "sync", "--detach", "hf://org/model", repo+":v1")
	id := start.lastLine()
	if !regexp.MustCompile(`^[0-9a-f]{12}$`).MatchString(id) {
		t.Fatalf("sync --detach printed %q, want a job ID\n%s", id, start)
	}
	// Wait until everything but the held file is uploaded.
	fast := int64(len(files["weights/a.bin"]) + len(files["weights/b.bin"]))
	deadline := time.Now().Add(20 * time.Second)
	for reg.Stats().BlobBytesIn < fast {
		if time.Now().After(deadline) {
			t.Fatalf("the job uploaded %d bytes, want %d; log:\n%s", reg.Stats().BlobBytesIn, fast, run(t, "jobs", "logs", id).stdout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // let the last upload finish
	j := syncJobByID(t, id)
	if j.State != "RUNNING" || j.PID == 0 {
		t.Fatalf("job before the kill: %+v", j)
	}
	if err := syscall.Kill(j.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for alive := true; alive; {
		alive = syscall.Kill(j.PID, 0) == nil
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", j.PID)); err == nil && strings.Contains(string(b), ") Z") {
			alive = false
		}
		time.Sleep(20 * time.Millisecond)
	}
	j = syncJobByID(t, id)
	if j.State != "FAILED" || !strings.Contains(j.Reason, "interrupted") {
		t.Fatalf("killed job: %+v", j)
	}
	if w := run(t, "jobs", "wait", id); w.code == 0 || !strings.Contains(w.stderr, "jobs resume "+id) {
		t.Errorf("jobs wait on a killed job:\n%s", w)
	}
	if n := reg.Stats().Requests["PUT manifest"]; n != 0 {
		t.Fatalf("%d manifests stored before the kill", n)
	}

	release()
	reg.ResetStats()
	mustRun(t, "jobs", "resume", id)
	waited := mustRun(t, "jobs", "wait", id)
	ref := waited.lastLine()
	if m := syncRefRE.FindStringSubmatch(ref); m == nil || m[1] != repo {
		t.Fatalf("jobs wait printed %q\n%s", ref, waited)
	}
	slow := int64(len(files["zz-slow.bin"]))
	if in := reg.Stats().BlobBytesIn; in < slow || in > slow+64<<10 {
		t.Errorf("the resumed job uploaded %d blob bytes; want the missing %d (plus small files and metadata)", in, slow)
	}

	var vs []versionJSON
	if err := json.Unmarshal([]byte(mustRun(t, "versions", "--json", repo).stdout), &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) != 1 || repo+"@"+vs[0].Digest != ref {
		t.Fatalf("versions lists %+v; jobs wait returned %s", vs, ref)
	}
	syncCheckTree(t, ref, files)
	syncCheckNoSecrets(t, jobsDir, start.stdout, start.stderr, waited.stdout, waited.stderr)
}

func TestSyncS3PrefixThroughTheAWSSDK(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket("ckpt"); err != nil {
		t.Fatal(err)
	}
	objects := map[string][]byte{
		"run1/step-100/model.bin":  randBytes(201, 9<<20+3),
		"run1/step-100/optim.json": []byte(`{"lr":0.001}`),
		"run1/step-100/notes.md":   []byte("notes\n"),
		"run1/config.yaml":         []byte("layers: 2\n"),
		"run10/other.bin":          []byte("not under run1/"),
	}
	for k, b := range objects {
		if _, err := backend.PutObject("ckpt", k, map[string]string{}, bytes.NewReader(b), int64(len(b)), nil); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	jobsDir := syncEnv(t, nil)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAE2ETEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", syncAWSSecret)
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_ENDPOINT_URL", srv.URL)
	layoutDir := filepath.Join(t.TempDir(), "layout")

	res := mustRun(t, "sync", "s3://ckpt/run1", "oci:"+layoutDir+":step100", "--exclude", "*.md")
	ref := res.lastLine()
	if m := syncRefRE.FindStringSubmatch(ref); m == nil || m[1] != "oci:"+layoutDir {
		t.Fatalf("last line %q\n%s", ref, res)
	}
	syncCheckTree(t, ref, map[string][]byte{
		"step-100/model.bin":  objects["run1/step-100/model.bin"],
		"step-100/optim.json": objects["run1/step-100/optim.json"],
		"config.yaml":         objects["run1/config.yaml"],
	})

	// --endpoint instead of AWS_ENDPOINT_URL, one object, detached.
	t.Setenv("AWS_ENDPOINT_URL", "")
	id := mustRun(t, "sync", "--detach", "--endpoint", srv.URL, "s3://ckpt/run1/step-100/model.bin", "oci:"+layoutDir+":weights").lastLine()
	ref2 := mustRun(t, "jobs", "wait", id).lastLine()
	syncCheckTree(t, ref2, map[string][]byte{"model.bin": objects["run1/step-100/model.bin"]})
	syncCheckNoSecrets(t, jobsDir, res.stdout, res.stderr)
}

func TestSyncJobsWaitInterruptedKeepsTheJobAndCancelStopsIt(t *testing.T) {
	files, lfs := syncModel()
	h := newSyncHub(t, files, lfs)
	syncEnv(t, h)
	reg := newDistribution(t)
	h.hold("zz-slow.bin")
	id := mustRun(t, "sync", "--detach", "hf://org/model", reg.Host+"/team/model:v1").lastLine()

	// Ctrl+C stops the waiting, not the job, and says how to go on.
	cmd := exec.Command(bin(t), "jobs", "wait", id)
	cmd.Env = append(os.Environ(), "HOME="+home(t), "XDG_CACHE_HOME="+home(t), "DOCKER_CONFIG="+home(t))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err == nil {
		t.Errorf("interrupted jobs wait exited 0")
	}
	for _, want := range []string{"jobs wait " + id, "jobs cancel " + id} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("interrupted jobs wait does not say %q:\n%s", want, stderr.String())
		}
	}
	if j := syncJobByID(t, id); j.State != "RUNNING" {
		t.Fatalf("after an interrupted wait the job is %+v", j)
	}

	mustRun(t, "jobs", "cancel", id)
	if j := syncJobByID(t, id); j.State != "CANCELED" || j.PID != 0 {
		t.Fatalf("canceled job: %+v", j)
	}
	if w := run(t, "jobs", "wait", id); w.code == 0 || !strings.Contains(w.stderr, "canceled") {
		t.Errorf("jobs wait on a canceled job:\n%s", w)
	}
	if n := reg.Stats().Requests["PUT manifest"]; n != 0 {
		t.Errorf("a canceled job stored %d manifests", n)
	}
}

// contentCounter counts the file content bytes a syncHub serves.
type contentCounter struct {
	http.ResponseWriter
	h *syncHub
}

func (c *contentCounter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.h.mu.Lock()
	c.h.contentBytes += int64(n)
	c.h.mu.Unlock()
	return n, err
}

// contentServed returns the file content bytes served so far and zeroes
// the count.
func (h *syncHub) contentServed() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.contentBytes
	h.contentBytes = 0
	return n
}

// cuttingWriter sends the headers and half of the announced body, then
// drops the connection.
type cuttingWriter struct {
	http.ResponseWriter
	left int64
	set  bool
}

func (c *cuttingWriter) Write(b []byte) (int, error) {
	if !c.set {
		n, _ := strconv.ParseInt(c.Header().Get("Content-Length"), 10, 64)
		c.left, c.set = n/2, true
	}
	if int64(len(b)) > c.left {
		c.ResponseWriter.Write(b[:c.left])
		panic(http.ErrAbortHandler)
	}
	c.left -= int64(len(b))
	return c.ResponseWriter.Write(b)
}

// A sync through a CDN that answers 503 and cuts bodies half-way completes
// bit-exact: requests are retried and cut ranges fetched again.
func TestSyncThroughCDNFaults(t *testing.T) {
	files, lfs := syncModel()
	h := newSyncHub(t, files, lfs)
	syncEnv(t, h)
	reg := newDistribution(t)
	repo := reg.Host + "/team/faults"
	h.mu.Lock()
	h.fail503, h.cut = 2, 3
	h.mu.Unlock()
	res := run(t, "sync", "hf://org/model", repo+":v1")
	h.mu.Lock()
	left503, leftCut := h.fail503, h.cut
	h.mu.Unlock()
	if left503 != 0 || leftCut != 0 {
		t.Fatalf("the faults did not all fire (503 left %d, cuts left %d)", left503, leftCut)
	}
	if res.code != 0 {
		t.Fatalf("sync through CDN faults failed:\n%s", res)
	}
	syncCheckTree(t, res.lastLine(), files)
}

// syncMetadataCreds is what the fake cloud metadata service answers: the
// machine's role credentials, which a sync must never seal.
const syncMetadataCreds = `{"Code":"Success","AccessKeyId":"ASIAE2EMETADATA","SecretAccessKey":"e2e-instance-role-secret"}`

// runWithEnv is run with extra environment variables, which run strips
// or does not pass (the HTTP proxy variables).
func runWithEnv(t *testing.T, extra []string, args ...string) result {
	t.Helper()
	h := home(t)
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t), args...)
	env := []string{}
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); strings.ToUpper(k) {
		case "HOME", "XDG_CACHE_HOME", "DOCKER_CONFIG", "XDG_CONFIG_HOME", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY":
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(append(env, "HOME="+h, "XDG_CACHE_HOME="+h, "DOCKER_CONFIG="+h), extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("timed out after %v:\n%s", runTimeout, res)
	case err == nil:
	case errors.As(err, &exitErr):
		res.code = exitErr.ExitCode()
	default:
		t.Fatalf("bdnvol %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// syncCheckNothingSealed fails when the layout at dir holds a version or
// any file with the metadata service's secret.
func syncCheckNothingSealed(t *testing.T, dir string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, "index.json")); err == nil {
		var idx struct{ Manifests []json.RawMessage }
		mustJSON(t, b, &idx)
		if len(idx.Manifests) != 0 {
			t.Errorf("the layout holds %d manifests after a refused sync", len(idx.Manifests))
		}
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte("e2e-instance-role-secret")) {
				t.Errorf("%s holds the metadata service's credentials", p)
			}
		}
		return nil
	})
}

// A source that redirects to the cloud metadata service (169.254.169.254)
// used to have the machine's credentials sealed into the version. The sync
// now fails, naming the address and the flag that would allow it, and
// nothing reaches the metadata service or the layout. The source and the
// "metadata service" sit behind an HTTP proxy (as in many clusters), which
// is how this test reaches addresses it cannot listen on.
func TestSyncRedirectToMetadataServiceIsRefusedAndNothingSealed(t *testing.T) {
	var mdRequests atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Hostname() {
		case "models.example":
			if r.URL.Path == "/model.bin" {
				http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/iam/security-credentials/node-role", http.StatusFound)
				return
			}
		case "169.254.169.254":
			mdRequests.Add(1)
			fmt.Fprint(w, syncMetadataCreds)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(proxy.Close)
	syncEnv(t, nil)
	env := []string{"HTTP_PROXY=" + proxy.URL, "NO_PROXY="}
	layoutDir := filepath.Join(t.TempDir(), "layout")

	res := runWithEnv(t, env, "sync", "http://models.example/model.bin", "oci:"+layoutDir+":v1")
	if res.code == 0 {
		t.Fatalf("the sync of a redirect to the metadata service succeeded (it sealed %d bytes of credentials):\n%s",
			len(syncMetadataCreds), res)
	}
	for _, want := range []string{"169.254.169.254", "cloud metadata service", "--allow-link-local"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, res)
		}
	}
	if n := mdRequests.Load(); n != 0 {
		t.Errorf("the metadata service got %d requests", n)
	}
	syncCheckNothingSealed(t, layoutDir)
	if js := syncJobs(t); len(js) != 1 || js[0].State != "FAILED" || !strings.Contains(js[0].Reason, "169.254.169.254") {
		t.Errorf("jobs: %+v", js)
	}
}

// linkLocalAddr returns an IPv6 link-local address of one of this
// machine's interfaces (with its zone), which a listener can bind.
func linkLocalAddr() (netip.Addr, bool) {
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr().Is6() && pfx.Addr().IsLinkLocalUnicast() {
				return pfx.Addr().WithZone(ifc.Name), true
			}
		}
	}
	return netip.Addr{}, false
}

// A --list entry naming a link-local address is refused at dial time (no
// proxy: the check is on the address the CLI would connect to), even with
// --allow-private-network for the list's own loopback server; the
// listener on that address sees no connection. With --allow-link-local
// the same list syncs, so the listener was reachable. A machine with no
// IPv6 link-local address to listen on gets the refusal checked against
// the IPv4 metadata address instead (nothing needs to listen there: the
// dial is refused before it starts), and the second half is not run.
func TestSyncListEntryOnLinkLocalAddressIsRefused(t *testing.T) {
	var accepts atomic.Int64
	shown, target := "169.254.169.254", "http://169.254.169.254:1/latest/meta-data/iam/security-credentials/node-role"
	listening := false
	if ll, ok := linkLocalAddr(); ok {
		if ln, err := net.Listen("tcp", netip.AddrPortFrom(ll, 0).String()); err == nil {
			inner := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprint(w, syncMetadataCreds)
			}), ConnState: func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					accepts.Add(1)
				}
			}}
			go inner.Serve(ln)
			t.Cleanup(func() { inner.Close() })
			// The listener's address lacks the zone, which a link-local dial needs.
			at := netip.AddrPortFrom(ll, uint16(ln.Addr().(*net.TCPAddr).Port)).String()
			shown, listening = ll.WithZone("").String(), true
			target = "http://" + strings.Replace(at, "%", "%25", 1) + "/latest/meta-data/iam/security-credentials/node-role"
		}
	}
	list := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s creds.json\n", target)
	}))
	t.Cleanup(list.Close)
	syncEnv(t, nil)
	layoutDir := filepath.Join(t.TempDir(), "layout")

	res := run(t, "sync", "--list", "--allow-private-network", list.URL+"/files.txt", "oci:"+layoutDir+":v1")
	if res.code == 0 {
		t.Fatalf("the sync of a list naming %s succeeded:\n%s", shown, res)
	}
	for _, want := range []string{shown, "link-local", "--allow-link-local"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, res)
		}
	}
	if n := accepts.Load(); n != 0 {
		t.Errorf("the link-local listener accepted %d connections", n)
	}
	syncCheckNothingSealed(t, layoutDir)
	if !listening {
		t.Log("no IPv6 link-local address to listen on: the refusal was checked on 169.254.169.254, the --allow-link-local half not run")
		return
	}
	ok2 := run(t, "sync", "--list", "--allow-private-network", "--allow-link-local", list.URL+"/files.txt", "oci:"+layoutDir+":v2")
	if ok2.code != 0 || accepts.Load() == 0 {
		t.Fatalf("with --allow-link-local the list did not sync from %s:\n%s", shown, ok2)
	}
}
