package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cliEnv is the environment run gives the CLI: the test's HOME, cache and
// docker config, no proxies; extra is appended.
func cliEnv(t testing.TB, extra ...string) []string {
	t.Helper()
	h := home(t)
	env := []string{}
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "HOME", "XDG_CACHE_HOME", "DOCKER_CONFIG", "XDG_CONFIG_HOME", "SSL_CERT_FILE", "SSL_CERT_DIR",
			"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy":
			continue
		}
		env = append(env, kv)
	}
	return append(append(env, "HOME="+h, "XDG_CACHE_HOME="+h, "DOCKER_CONFIG="+h), extra...)
}

// runWith is run with standard input and extra environment variables.
func runWith(t testing.TB, stdin string, extraEnv []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t), args...)
	cmd.Env = cliEnv(t, extraEnv...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{args: args, stdout: stdout.String(), stderr: stderr.String()}
	if ctx.Err() != nil {
		t.Fatalf("timed out after %v:\n%s", runTimeout, res)
	}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("bdnvol %s: %v", strings.Join(args, " "), err)
		}
		res.code = ee.ExitCode()
	}
	return res
}

// linkedBlobs lists the blobs a repository of a filesystem-backed
// distribution holds (complete, linked into the repository).
func linkedBlobs(t testing.TB, root, name string) map[string]bool {
	t.Helper()
	dir := filepath.Join(root, "docker", "registry", "v2", "repositories", filepath.FromSlash(name), "_layers", "sha256")
	des, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, de := range des {
		if _, err := os.Stat(filepath.Join(dir, de.Name(), "link")); err == nil {
			m["sha256:"+de.Name()] = true
		}
	}
	return m
}

// versionBlobs returns the blobs (configs and layers, of every part) of the
// version with the given root digest, with their sizes.
func versionBlobs(t testing.TB, reg *registry, name, digest string) map[string]int64 {
	t.Helper()
	blobs := map[string]int64{}
	var walk func(d string)
	walk = func(d string) {
		raw, _ := getManifest(t, reg, name, d, manifestAccepts)
		var m ociManifest
		mustJSON(t, raw, &m)
		for _, sub := range m.Manifests {
			walk(sub.Digest)
		}
		if m.Config != nil {
			blobs[m.Config.Digest] = m.Config.Size
		}
		for _, l := range m.Layers {
			blobs[l.Digest] = l.Size
		}
	}
	walk(digest)
	return blobs
}

// manifestBytes is the size of the manifests of the version with the given
// root digest: the root and, for a big volume, its parts.
func manifestBytes(t testing.TB, reg *registry, name, digest string) int64 {
	t.Helper()
	raw, _ := getManifest(t, reg, name, digest, manifestAccepts)
	var m ociManifest
	mustJSON(t, raw, &m)
	n := int64(len(raw))
	for _, sub := range m.Manifests {
		n += sub.Size
	}
	return n
}

// tagDigest returns what tag points at, or "" if there is no such tag.
func tagDigest(t testing.TB, reg *registry, name, tag string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodHead, reg.URL+"/v2/"+name+"/manifests/"+tag, nil)
	req.Header.Set("Accept", manifestAccepts)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return ""
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD %s:%s: %s", name, tag, resp.Status)
	}
	return resp.Header.Get("Docker-Content-Digest")
}

// TestPushKill9 kills `bdnvol push` with SIGKILL at seeded random moments
// spread over a push's duration: no tag ever points at an incomplete
// version, and the re-run completes uploading only what is missing.
func TestPushKill9(t *testing.T) {
	root := t.TempDir()
	reg := newDistributionAt(t, root)
	src := filepath.Join(t.TempDir(), "src")
	var nodes []node
	for i := range 4 {
		nodes = append(nodes, fileNode(fmt.Sprintf("shard-%d.bin", i), 0o644, randBytes(uint64(600+i), 24<<20)))
	}
	buildTree(t, src, nodes, time.Time{})
	flags := []string{"--chunk-min", "256KiB", "--chunk-avg", "1MiB", "--chunk-max", "2MiB"}

	// The first push warms the stat cache the killed pushes use; the next
	// two, to new repositories, give the duration to spread the kills over.
	want := pushJSON(t, reg.Host+"/vols/warm:v1", src, flags...).Digest
	var dur time.Duration
	for i := range 2 {
		start := time.Now()
		pushJSON(t, reg.Host+fmt.Sprintf("/vols/calibrate%d:v1", i), src, flags...)
		if el := time.Since(start); dur == 0 || el < dur {
			dur = el
		}
	}
	verified := map[string]bool{}

	const seed, runs = 6, 12
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("push takes %v; %d kills, seed %d", dur, runs, seed)
	for i := range runs {
		name := fmt.Sprintf("vols/kill%02d", i)
		delay := time.Duration((float64(i) + rng.Float64()) / runs * float64(dur))
		cmd := exec.Command(bin(t), append(append([]string{"push", "--json"}, flags...), reg.Host+"/"+name+":v1", src)...)
		cmd.Env = cliEnv(t)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		killed := false
		select {
		case err := <-done:
			t.Logf("run %d: push ended before the kill at %v: %v", i, delay, err)
		case <-time.After(delay):
			cmd.Process.Signal(syscall.SIGKILL)
			err := <-done
			killed = err != nil && strings.Contains(err.Error(), "killed")
			t.Logf("run %d: kill -9 at %v: %v", i, delay, err)
		}

		// The tag is absent or points at the whole version.
		for _, tag := range append([]string{"v1"}, volumeTags(t, reg, name)...) {
			d := tagDigest(t, reg, name, tag)
			if d == "" {
				continue
			}
			if d != want {
				t.Errorf("run %d: tag %s points at %s, not the pushed version %s", i, tag, d, want)
				continue
			}
			if !verified[name] {
				dst := filepath.Join(t.TempDir(), "dst")
				pull(t, reg.Host+"/"+name+":"+tag, dst)
				compareTrees(t, src, dst)
				verified[name] = true
			}
		}

		// The re-run uploads only what the registry lacks.
		reg.Settle(t) // bytes the killed push had sent may still be arriving
		present := linkedBlobs(t, root, name)
		reg.ResetStats()
		pr := pushJSON(t, reg.Host+"/"+name+":v1", src, flags...)
		in := reg.Stats().BlobBytesIn
		if pr.Digest != want {
			t.Fatalf("run %d: re-run pushed %s, want %s", i, pr.Digest, want)
		}
		var total, already int64
		for d, size := range versionBlobs(t, reg, name, pr.Digest) {
			total += size
			if present[d] {
				already += size
			}
		}
		manifests := manifestBytes(t, reg, name, pr.Digest)
		t.Logf("run %d (killed %v): %d of %d blob bytes were in the registry; re-run uploaded %d (manifests %d; registry received %d blob bytes)",
			i, killed, already, total, pr.BytesUploaded, manifests, in)
		if pr.BytesUploaded > total-already+manifests {
			t.Errorf("run %d: the re-run uploaded %d bytes, more than the %d missing (%d blob bytes and %d of manifests)",
				i, pr.BytesUploaded, total-already+manifests, total-already, manifests)
		}
		if in > total-already {
			t.Errorf("run %d: the registry received %d blob bytes in the re-run, more than the %d missing", i, in, total-already)
		}
		if d := tagDigest(t, reg, name, "v1"); d != want {
			t.Errorf("run %d: after the re-run v1 is %q, want %s", i, d, want)
		}
	}
	// The last repository's version pulls bit-exact.
	dst := filepath.Join(t.TempDir(), "final")
	pull(t, reg.Host+fmt.Sprintf("/vols/kill%02d:v1", runs-1), dst)
	compareTrees(t, src, dst)
}

// volumeTags lists the tags of a repository other than history records.
func volumeTags(t testing.TB, reg *registry, name string) []string {
	t.Helper()
	var tags []string
	for _, tag := range listTags(t, reg, name) {
		if !strings.HasPrefix(tag, "history-") {
			tags = append(tags, tag)
		}
	}
	return tags
}
