package retention

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

const (
	hexA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	hexB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func mustRef(t *testing.T, s string) oci.Ref {
	t.Helper()
	r, err := oci.ParseRef(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// got formats references as SOURCE|REF|TAG|DIGEST for comparison.
func got(refs []Reference) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Source+"|"+r.Ref+"|"+r.Tag+"|"+string(r.Digest))
	}
	return out
}

func TestScan(t *testing.T) {
	repo := mustRef(t, "reg.example:5000/team/llama")
	text := `# deploy: reg.example:5000/team/llama@sha256:` + hexB + ` in a comment counts too
mounts:
  - source: reg.example:5000/team/llama:prod@sha256:` + hexA + `
  - source: "reg.example:5000/team/llama@sha256:` + hexA + `"
args: ["--model=reg.example:5000/team/llama:v2", "x"]
other: reg.example:5000/team/llama2@sha256:` + hexA + `
other2: xreg.example:5000/team/llama@sha256:` + hexA + `
sub: reg.example:5000/team/llama/sub@sha256:` + hexA + `
bare: reg.example:5000/team/llama
short: reg.example:5000/team/llama@sha256:abc
annotation: "{\"image\":\"reg.example:5000/team/llama@sha256:` + hexB + `\"}"
`
	want := []string{
		"f.yaml:1|reg.example:5000/team/llama@sha256:" + hexB + "||sha256:" + hexB,
		"f.yaml:3|reg.example:5000/team/llama:prod@sha256:" + hexA + "|prod|sha256:" + hexA,
		"f.yaml:4|reg.example:5000/team/llama@sha256:" + hexA + "||sha256:" + hexA,
		"f.yaml:5|reg.example:5000/team/llama:v2|v2|",
		"f.yaml:11|reg.example:5000/team/llama@sha256:" + hexB + "||sha256:" + hexB,
	}
	if g := got(Scan(repo, "f.yaml", []byte(text))); !slices.Equal(g, want) {
		t.Errorf("got\n  %s\nwant\n  %s", strings.Join(g, "\n  "), strings.Join(want, "\n  "))
	}
	// kubectl-style JSON on one line, and text that is not YAML at all.
	js := `{"items":[{"spec":{"volumes":[{"image":{"reference":"reg.example:5000/team/llama@sha256:` + hexA + `"}}]}}]}`
	if g := got(Scan(repo, "stdin", []byte(js))); len(g) != 1 || !strings.HasPrefix(g[0], "stdin:1|") {
		t.Errorf("JSON: %v", g)
	}
	bad := "key: [unclosed\nreg.example:5000/team/llama@sha256:" + hexA + "\n"
	if g := got(Scan(repo, "x", []byte(bad))); len(g) != 1 || !strings.HasPrefix(g[0], "x:2|") {
		t.Errorf("non-YAML: %v", g)
	}
}

func TestScanLayoutRelative(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	repo := mustRef(t, "oci:vols/llama")
	text := "a: oci:vols/llama@sha256:" + hexA + "\nb: oci:" + filepath.Join(dir, "vols/llama") + ":v1@sha256:" + hexB + "\nc: oci:vols/other@sha256:" + hexA + "\n"
	g := got(Scan(repo, "f", []byte(text)))
	want := []string{
		"f:2|oci:" + filepath.Join(dir, "vols/llama") + ":v1@sha256:" + hexB + "|v1|sha256:" + hexB,
		"f:1|oci:vols/llama@sha256:" + hexA + "||sha256:" + hexA,
	}
	if !slices.Equal(g, want) {
		t.Errorf("got %v\nwant %v", g, want)
	}
}

func TestScanPaths(t *testing.T) {
	repo := mustRef(t, "reg.example/llama")
	dir := t.TempDir()
	write := func(p, s string) {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ref := "reg.example/llama@sha256:" + hexA
	write("deploy/app.yaml", "x: 1\nsource: "+ref+"\n")
	write("deploy/k8s/dep.json", `{"image": "`+ref+`"}`)
	write("deploy/notes.txt", ref)
	write("deploy/.git/config.yaml", ref)
	write("single.conf", "\n\n"+ref)
	refs, err := ScanPaths(repo, []string{filepath.Join(dir, "deploy"), filepath.Join(dir, "single.conf")})
	if err != nil {
		t.Fatal(err)
	}
	var srcs []string
	for _, r := range refs {
		srcs = append(srcs, strings.TrimPrefix(r.Source, dir+"/"))
	}
	if want := []string{"deploy/app.yaml:2", "deploy/k8s/dep.json:1", "single.conf:3"}; !slices.Equal(srcs, want) {
		t.Errorf("sources %v, want %v", srcs, want)
	}
	if _, err := ScanPaths(repo, []string{filepath.Join(dir, "missing")}); err == nil {
		t.Error("a missing path is not an error")
	}
}
