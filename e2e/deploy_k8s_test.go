package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// exampleRepo is the volume repository the shipped Kubernetes examples name.
const exampleRepo = "registry.example.com/team/llama"

// lineOf returns the 1-based line of the first line of text holding s.
func lineOf(t *testing.T, text, s string) int {
	t.Helper()
	for i, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("%q not in\n%s", s, text)
	return 0
}

// TestPinAndLintKubernetesCSI pins and lints the shipped Kubernetes
// examples (a Deployment with an inline bdnvol CSI volume; a
// PersistentVolume whose volumeHandle is the reference, its claim and a
// Deployment) against a real registry, without --all: the references of
// bdnvol CSI volumes are volume references by their place.
func TestPinAndLintKubernetesCSI(t *testing.T) {
	reg := newDistribution(t)
	const name = "team/llama"
	repo := reg.Host + "/" + name
	dirs := llamaTrees(t)
	v1 := pushJSON(t, repo+":v1", dirs[0], smallChunks...)
	v2 := pushJSON(t, repo+":v2", dirs[1], append([]string{"--tag", "prod"}, smallChunks...)...)
	work := t.TempDir()

	var files, origs []string
	for _, f := range []string{"deployment.yaml", "persistentvolume.yaml"} {
		b, err := os.ReadFile(filepath.Join(manifestsDir, "examples", f))
		if err != nil {
			t.Fatal(err)
		}
		orig := strings.ReplaceAll(string(b), exampleRepo+":", repo+":")
		if !strings.Contains(orig, repo+":prod") {
			t.Fatalf("examples/%s names no %s:prod", f, exampleRepo)
		}
		p := filepath.Join(work, f)
		mustWrite(t, p, []byte(orig))
		files, origs = append(files, p), append(origs, orig)
	}
	deployment, pv := files[0], files[1]
	refLine := lineOf(t, origs[0], "ref: "+repo+":prod")
	handleLine := lineOf(t, origs[1], "volumeHandle: "+repo+":prod")

	// Unpinned: lint fails naming file:line of each reference.
	r := run(t, append([]string{"lint"}, files...)...)
	for _, want := range []string{
		deployment + ":" + strconv.Itoa(refLine) + ": " + repo + ":prod: not pinned",
		pv + ":" + strconv.Itoa(handleLine) + ": " + repo + ":prod: not pinned",
	} {
		if r.code != 1 || !strings.Contains(r.stdout, want) {
			t.Fatalf("lint of unpinned manifests should exit 1 and report %q:\n%s", want, r)
		}
	}
	if n := strings.Count(r.stdout, "\n"); n != 2 {
		t.Fatalf("lint reported %d lines, want 2 (container images and other keys are not volume references):\n%s", n, r)
	}

	// Pin: only the references change, byte for byte.
	r = mustRun(t, append([]string{"pin"}, files...)...)
	if !strings.Contains(r.stdout, deployment+":"+strconv.Itoa(refLine)+": ") || !strings.Contains(r.stdout, pv+":"+strconv.Itoa(handleLine)+": ") {
		t.Fatalf("pin should list both changes:\n%s", r)
	}
	for i, f := range files {
		want := strings.ReplaceAll(origs[i], repo+":prod", repo+":prod@"+v2.Digest)
		if got := string(fileContents(t, f)); got != want {
			t.Fatalf("pinned %s differs beyond the reference:\n--- got\n%s--- want\n%s", f, got, want)
		}
	}
	mustRun(t, append([]string{"lint"}, files...)...)

	// prod moves back to v1: lint says so for both; pin --update follows.
	mustRun(t, "tag", repo+":v1", "prod")
	r = run(t, append([]string{"lint"}, files...)...)
	if r.code != 1 || strings.Count(r.stdout, "prod moved since this was pinned") != 2 || !strings.Contains(r.stdout, v1.Digest) {
		t.Fatalf("lint after prod moved should report both references:\n%s", r)
	}
	mustRun(t, append([]string{"pin", "--update"}, files...)...)
	for i, f := range files {
		want := strings.ReplaceAll(origs[i], repo+":prod", repo+":prod@"+v1.Digest)
		if got := string(fileContents(t, f)); got != want {
			t.Fatalf("pin --update of %s:\n%s", f, got)
		}
	}
	mustRun(t, append([]string{"lint"}, files...)...)
}
