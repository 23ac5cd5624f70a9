package imagebuild

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	dOld = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	dNew = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

const daemonSet = `spec:
  containers:
    - name: registrar
      image: registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.15.0@` + dOld + `
    - name: mounter
      image: registry.example.com/bdnvol/bdnvol@` + dOld + `   # bdnvol
    - name: node
      image: "registry.example.com/bdnvol/bdnvol:dev"
    - name: other
      image: registry.example.com/bdnvol/bdnvol-tools@` + dOld + `
    - {name: x, image: registry.example.com/bdnvol/other}
`

func TestRewriteImages(t *testing.T) {
	refs := FindImages([]byte(daemonSet))
	if len(refs) != 2 || refs[0].Line != 6 || refs[0].Digest != dOld || refs[1].Line != 8 || refs[1].Digest != "" ||
		refs[1].Repo != "registry.example.com/bdnvol/bdnvol" {
		t.Fatalf("found %+v", refs)
	}
	out, n := RewriteImages([]byte(daemonSet), "", dNew)
	want := strings.NewReplacer(
		"registry.example.com/bdnvol/bdnvol@"+dOld+"   # bdnvol", "registry.example.com/bdnvol/bdnvol@"+dNew+"   # bdnvol",
		`"registry.example.com/bdnvol/bdnvol:dev"`, `"registry.example.com/bdnvol/bdnvol@`+dNew+`"`,
	).Replace(daemonSet)
	if n != 2 || string(out) != want {
		t.Fatalf("rewrote %d:\n%s\nwant\n%s", n, out, want)
	}
	out, n = RewriteImages([]byte(daemonSet), "mirror.example:5000/ops/bdnvol", dNew)
	if n != 2 || strings.Count(string(out), "mirror.example:5000/ops/bdnvol@"+dNew) != 2 || !strings.Contains(string(out), "registrar:v2.15.0@"+dOld) {
		t.Fatalf("rewrote %d with a repository:\n%s", n, out)
	}
}

func TestRewriteAndCheckManifests(t *testing.T) {
	dir := t.TempDir()
	ds := filepath.Join(dir, "node.yaml")
	other := filepath.Join(dir, "csidriver.yaml")
	if err := os.WriteFile(ds, []byte(daemonSet), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, []byte("kind: CSIDriver\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckManifests(dir, dNew); err == nil || !strings.Contains(err.Error(), "node.yaml:6:") || !strings.Contains(err.Error(), "node.yaml:8:") {
		t.Fatalf("check before rewriting: %v", err)
	}
	n, err := RewriteManifests(dir, "", dNew)
	if err != nil || n != 2 {
		t.Fatalf("rewrite: %d %v", n, err)
	}
	if err := CheckManifests(dir, dNew); err != nil {
		t.Fatalf("check after rewriting: %v", err)
	}
	if err := CheckManifests(dir, dOld); err == nil {
		t.Fatal("check against another digest passed")
	}
	if st, err := os.Stat(other); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("an untouched file changed: %v %v", st.Mode(), err)
	}
	if _, err := RewriteManifests(dir, "registry.example.com/ops/bdnvol-csi", dNew); err == nil || !strings.Contains(err.Error(), "bdnvol-csi") {
		t.Fatalf("a repository not named bdnvol: %v", err)
	}
	if _, err := RewriteManifests(t.TempDir(), "", dNew); err == nil {
		t.Fatal("a directory without bdnvol images rewrote fine")
	}
}
