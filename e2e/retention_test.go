package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// retentionSite is where the retention test runs: the distribution
// registry served by its own binary, or an OCI layout.
type retentionSite struct {
	repo       string                // reference prefix of the volume
	registryGC func()                // stop the registry, garbage-collect offline, restart; nil for a layout
	manifest   func(d string) []byte // a manifest by digest
	blobExists func(d string) bool   // whether the blob (or manifest) is stored
	diskUsage  func() int64          // bytes of blobs stored; layouts only
}

func TestRetention(t *testing.T) {
	t.Run("distribution", func(t *testing.T) {
		t.Parallel()
		reg := startRegistryBinary(t)
		get := func(path, accept string) (int, []byte) {
			req, err := http.NewRequest(http.MethodGet, "http://"+reg.host+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if accept != "" {
				req.Header.Set("Accept", accept)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			return resp.StatusCode, b.Bytes()
		}
		retentionFlow(t, retentionSite{
			repo:       reg.host + "/team/llama",
			registryGC: reg.garbageCollect,
			manifest: func(d string) []byte {
				code, b := get("/v2/team/llama/manifests/"+d, manifestAccepts)
				if code != http.StatusOK {
					t.Fatalf("GET manifest %s: %d", d, code)
				}
				return b
			},
			blobExists: func(d string) bool {
				code, _ := get("/v2/team/llama/blobs/"+d, "")
				mcode, _ := get("/v2/team/llama/manifests/"+d, manifestAccepts)
				return code == http.StatusOK || mcode == http.StatusOK
			},
		})
	})
	t.Run("oci-layout", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "llama")
		retentionFlow(t, retentionSite{
			repo:     "oci:" + dir,
			manifest: func(d string) []byte { return layoutBlob(t, dir, d) },
			blobExists: func(d string) bool {
				_, err := os.Stat(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")))
				return err == nil
			},
			diskUsage: func() int64 {
				var n int64
				err := filepath.Walk(filepath.Join(dir, "blobs"), func(_ string, fi os.FileInfo, err error) error {
					if err == nil && fi.Mode().IsRegular() {
						n += fi.Size()
					}
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				return n
			},
		})
	})
}

// gcJSON is the part of gc --json the test reads.
type gcJSON struct {
	Plan struct {
		Versions []gcDecision `json:"versions"`
		Deleted  []gcDecision `json:"deleted"`
		Warnings []struct {
			Source string `json:"source"`
			Digest string `json:"digest"`
		} `json:"warnings"`
	} `json:"plan"`
	Results []struct {
		Digest  string `json:"digest"`
		Action  string `json:"action"`
		Done    bool   `json:"done"`
		Skipped string `json:"skipped"`
		Error   string `json:"error"`
	} `json:"results"`
	Swept *struct {
		Blobs int   `json:"blobs"`
		Bytes int64 `json:"bytes"`
	} `json:"swept"`
}

type gcDecision struct {
	Digest  string `json:"digest"`
	Action  string `json:"action"`
	Reasons []struct {
		Kind string `json:"kind"`
		Text string `json:"text"`
	} `json:"reasons"`
}

type deletedJSON struct {
	Digest    string     `json:"digest"`
	Tags      []string   `json:"tags"`
	Tombstone descriptor `json:"tombstone"`
}

func retentionFlow(t *testing.T, s retentionSite) {
	work := t.TempDir()
	// v1..v6: a file all share, one of their own, and the previous
	// version's own file, so each shares chunks with its neighbours.
	var dirs [7]string
	var digests [7]string
	name := map[string]string{}
	for i := 1; i <= 6; i++ {
		dirs[i] = filepath.Join(work, fmt.Sprintf("v%d", i))
		buildTree(t, dirs[i], []node{
			fileNode("shared.bin", 0o644, randBytes(100, 200<<10)),
			fileNode("own.bin", 0o644, randBytes(uint64(10+i), 96<<10)),
			fileNode("prev.bin", 0o644, randBytes(uint64(10+i-1), 96<<10)),
			fileNode("version.txt", 0o644, []byte(fmt.Sprintf("v%d\n", i))),
		}, time.Time{})
		flags := smallChunks
		if i == 5 {
			flags = append([]string{"--tag", "prod"}, smallChunks...)
		}
		if i > 1 {
			waitNextSecond()
		}
		digests[i] = pushJSON(t, s.repo, dirs[i], flags...).Digest
		name[digests[i]] = fmt.Sprintf("v%d", i)
	}
	v := func(i int) string { return s.repo + "@" + digests[i] }
	missing := "sha256:" + strings.Repeat("0", 64)
	mustWrite(t, filepath.Join(mkdir(t, filepath.Join(work, "deploy")), "app.yaml"), []byte(
		"# the inference service\nmounts:\n  - source: "+v(2)+"\n    path: /models/llama\n    readOnly: true\n"))
	mustWrite(t, filepath.Join(work, "deploy", "old.json"), []byte(
		"{\n  \"source\": \""+s.repo+":old@"+missing+"\"\n}\n"))
	mustWrite(t, filepath.Join(work, "deploy", "README.txt"), []byte(v(3)+"\n")) // not YAML or JSON: ignored

	// The plan: v1, v3 and v4 go, each kept version says why.
	plan := runIn(t, work, "gc", s.repo, "--keep-last", "2", "--refs", "deploy/")
	if plan.code != 0 {
		t.Fatalf("gc plan:\n%s", plan)
	}
	wantWhy := map[int]string{6: "newest 2", 5: "tagged prod; newest 2", 2: "referenced by deploy/app.yaml:3"}
	for i := 1; i <= 6; i++ {
		line := lineWith(plan.stdout, digests[i])
		switch i {
		case 1, 3, 4:
			if !strings.HasPrefix(line, "DELETE ") {
				t.Errorf("v%d should be deleted: %q", i, line)
			}
		default:
			if !strings.HasPrefix(line, "KEEP ") || !strings.HasSuffix(line, wantWhy[i]) {
				t.Errorf("v%d: %q, want KEEP … %s", i, line, wantWhy[i])
			}
		}
	}
	if !strings.Contains(plan.stderr, "warning: deploy/old.json:2: ") || !strings.Contains(plan.stderr, missing) {
		t.Errorf("no warning for the reference to a missing digest:\n%s", plan)
	}
	if got := versionDigests(t, s.repo); len(got) != 6 {
		t.Fatalf("a plan without --apply changed the versions: %v", got)
	}

	// Apply it.
	res := runIn(t, work, "gc", s.repo, "--keep-last", "2", "--refs", "deploy/", "--apply", "--json")
	if res.code != 0 {
		t.Fatalf("gc --apply:\n%s", res)
	}
	var applied gcJSON
	mustJSON(t, []byte(res.stdout), &applied)
	var gone []string
	for _, r := range applied.Results {
		if !r.Done || r.Action != "delete" {
			t.Errorf("result %+v", r)
		}
		gone = append(gone, name[r.Digest])
	}
	slices.Sort(gone)
	if !slices.Equal(gone, []string{"v1", "v3", "v4"}) {
		t.Fatalf("gc deleted %v, want v1 v3 v4:\n%s", gone, res)
	}
	if got := versionDigests(t, s.repo); !slices.Equal(got, []string{digests[6], digests[5], digests[2]}) {
		t.Fatalf("versions after gc: %v", names(got, name))
	}
	var dels []deletedJSON
	mustJSON(t, []byte(mustRun(t, "versions", "--deleted", "--json", s.repo).stdout), &dels)
	if len(dels) != 3 {
		t.Fatalf("versions --deleted: %+v", dels)
	}
	// A second run finds nothing more to delete.
	if r := runIn(t, work, "gc", s.repo, "--keep-last", "2", "--refs", "deploy/", "--apply"); r.code != 0 || strings.Contains(r.stdout, "DELETE") {
		t.Errorf("second gc:\n%s", r)
	}

	// The registry's own garbage collector keeps everything a version or a
	// tombstone reaches.
	if s.registryGC != nil {
		s.registryGC()
	}
	for _, i := range []int{2, 5, 6} {
		dst := filepath.Join(t.TempDir(), "out")
		pull(t, v(i), dst)
		compareTrees(t, dirs[i], dst)
	}

	// rm refuses what a deploy file or standard input names.
	r := runIn(t, work, "rm", v(2), "--refs", "deploy/")
	if r.code != 1 || !strings.Contains(r.stderr, "deploy/app.yaml:3") {
		t.Errorf("rm of a referenced version should exit 1 naming deploy/app.yaml:3:\n%s", r)
	}
	kubectl := `{"items": [{"spec": {"volumes": [{"image": {"reference": "` + v(6) + `"}}]}}]}`
	r = runStdin(t, work, kubectl, "rm", v(6), "--refs", "-")
	if r.code != 1 || !strings.Contains(r.stderr, "stdin:1") {
		t.Errorf("rm of a version named on stdin should exit 1 naming stdin:1:\n%s", r)
	}
	if got := versionDigests(t, s.repo); len(got) != 3 {
		t.Fatalf("a refused rm changed the versions: %v", names(got, name))
	}

	// restore brings v3 back, whole, without tags.
	if r := mustRun(t, "restore", v(3)); r.lastLine() != v(3) {
		t.Errorf("restore printed %q", r.lastLine())
	}
	var vs []versionJSON
	mustJSON(t, []byte(mustRun(t, "versions", "--json", s.repo).stdout), &vs)
	// It is sealed anew, now: it counts as the newest (or ties with v6).
	if len(vs) != 4 || !slices.ContainsFunc(vs[:2], func(v versionJSON) bool { return v.Digest == digests[3] && len(v.Tags) == 0 }) {
		t.Fatalf("after restore: %+v", vs)
	}
	dst := filepath.Join(t.TempDir(), "v3")
	pull(t, v(3), dst)
	compareTrees(t, dirs[3], dst)
	if r := run(t, "restore", v(3)); r.code != 1 {
		t.Errorf("restoring a live version should fail:\n%s", r)
	}

	// Before purging: what only v1 and v4 (and their tombstones) hold.
	reach := func(is ...int) map[string]int64 {
		m := map[string]int64{}
		for _, i := range is {
			b := s.manifest(digests[i])
			m[digests[i]] = int64(len(b))
			var man ociManifest
			mustJSON(t, b, &man)
			m[man.Config.Digest] = man.Config.Size
			for _, l := range man.Layers {
				m[l.Digest] = l.Size
			}
		}
		return m
	}
	kept := reach(2, 3, 5, 6)
	unique := map[string]int64{}
	for d, n := range reach(1, 4) {
		if _, ok := kept[d]; !ok {
			unique[d] = n
		}
	}
	mustJSON(t, []byte(mustRun(t, "versions", "--deleted", "--json", s.repo).stdout), &dels)
	var uniqueBytes int64
	for _, n := range unique {
		uniqueBytes += n
	}
	for _, d := range dels {
		uniqueBytes += d.Tombstone.Size
		unique[d.Tombstone.Digest] = d.Tombstone.Size
	}
	if len(dels) != 2 || len(unique) < 6 {
		t.Fatalf("deleted %+v; unique blobs %v", dels, unique)
	}
	var before int64
	if s.diskUsage != nil {
		before = s.diskUsage()
	}

	// Purge after the window: v1 and v4 go for good.
	res = runIn(t, work, "gc", s.repo, "--keep-last", "2", "--refs", "deploy/", "--purge", "--restore-window", "0s", "--blob-grace", "0s", "--apply", "--json")
	if res.code != 0 {
		t.Fatalf("gc --purge:\n%s", res)
	}
	var purged gcJSON
	mustJSON(t, []byte(res.stdout), &purged)
	gone = nil
	for _, r := range purged.Results {
		if !r.Done {
			t.Errorf("result %+v", r)
		}
		gone = append(gone, r.Action+" "+name[r.Digest])
	}
	slices.Sort(gone)
	if !slices.Equal(gone, []string{"purge v1", "purge v4"}) {
		t.Fatalf("purge did %v:\n%s", gone, res)
	}
	if d := mustRun(t, "versions", "--deleted", "--json", s.repo).stdout; strings.TrimSpace(d) != "[]" {
		t.Errorf("versions --deleted after purge: %s", d)
	}
	for _, i := range []int{1, 4} {
		if r := run(t, "resolve", v(i)); r.code != 1 {
			t.Errorf("v%d still resolves after the purge:\n%s", i, r)
		}
		if r := run(t, "restore", v(i)); r.code != 1 {
			t.Errorf("v%d can be restored after the purge:\n%s", i, r)
		}
	}
	if s.diskUsage != nil {
		if drop := before - s.diskUsage(); drop != uniqueBytes {
			t.Errorf("disk use dropped by %d bytes, want the %d unique bytes of v1, v4 and their tombstones", drop, uniqueBytes)
		}
	}
	if s.registryGC != nil {
		s.registryGC()
	}
	for d := range unique {
		if s.blobExists(d) {
			t.Errorf("%s of a purged version survived", d)
		}
	}
	for d := range kept {
		if !s.blobExists(d) {
			t.Errorf("%s of a remaining version is gone", d)
		}
	}
	for _, i := range []int{3, 5} {
		dst := filepath.Join(t.TempDir(), "out")
		pull(t, v(i), dst)
		compareTrees(t, dirs[i], dst)
	}
}

// lineWith returns the line of s that contains sub, trimmed and with runs of
// spaces collapsed.
func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.Join(strings.Fields(l), " ")
		}
	}
	return ""
}

func versionDigests(t *testing.T, repo string) []string {
	t.Helper()
	var vs []versionJSON
	mustJSON(t, []byte(mustRun(t, "versions", "--json", repo).stdout), &vs)
	var out []string
	for _, v := range vs {
		out = append(out, v.Digest)
	}
	return out
}

func names(ds []string, name map[string]string) []string {
	var out []string
	for _, d := range ds {
		out = append(out, name[d])
	}
	return out
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runStdin is runIn with stdin as the command's standard input.
func runStdin(t *testing.T, dir, stdin string, args ...string) result {
	t.Helper()
	h := home(t)
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+h, "XDG_CACHE_HOME="+h, "DOCKER_CONFIG="+h)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		res.code = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("bdnvol %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// registryProc is the distribution registry run from its own binary.
type registryProc struct {
	t    *testing.T
	bin  string
	cfg  string
	host string
	cmd  *exec.Cmd
	logs bytes.Buffer
}

// startRegistryBinary builds github.com/distribution/distribution/v3/cmd/registry
// with this module's requirements (resolving the storage drivers it adds
// through a copy of go.mod, so the module itself is not changed) and serves
// a filesystem registry from a temporary directory on a free loopback port.
func startRegistryBinary(t *testing.T) *registryProc {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum"} {
		mustWrite(t, filepath.Join(dir, f), fileContents(t, f))
	}
	bin := filepath.Join(dir, "registry")
	build := exec.Command("go", "build", "-mod=mod", "-modfile="+filepath.Join(dir, "go.mod"), "-o", bin,
		"github.com/distribution/distribution/v3/cmd/registry")
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the registry: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close()
	cfg := filepath.Join(dir, "config.yml")
	mustWrite(t, cfg, []byte(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: `+filepath.Join(dir, "storage")+`
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: `+host+`
  secret: bdnvol-e2e-secret
`))
	r := &registryProc{t: t, bin: bin, cfg: cfg, host: host}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *registryProc) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, "serve", r.cfg)
	r.cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none")
	r.cmd.Stdout, r.cmd.Stderr = &r.logs, &r.logs
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + r.host + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("the registry did not come up on %s:\n%s", r.host, r.logs.String())
}

func (r *registryProc) stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-done
	}
	r.cmd = nil
}

// garbageCollect stops the registry, runs `registry garbage-collect`
// offline (without --delete-untagged), and starts it again on the same
// address.
func (r *registryProc) garbageCollect() {
	r.t.Helper()
	r.stop()
	out, err := exec.Command(r.bin, "garbage-collect", r.cfg).CombinedOutput()
	if err != nil {
		r.t.Fatalf("registry garbage-collect: %v\n%s", err, out)
	}
	r.start()
}
