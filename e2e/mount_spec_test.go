package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `bdnvol mount --spec bdnvol.yaml ROOT` mounts every entry of a deploy file
// at ROOT/<path>, from a registry and from an OCI layout.
func TestMountSpec(t *testing.T) {
	requireFUSE(t)
	reg := newDistribution(t)
	srcA := filepath.Join(t.TempDir(), "a")
	srcB := filepath.Join(t.TempDir(), "b")
	buildTree(t, srcA, richTree(), time.Time{})
	buildTree(t, srcB, []node{fileNode("weights.bin", 0o644, randBytes(9, 300<<10)), fileNode("config.json", 0o644, []byte(`{"b":1}`))}, time.Time{})
	repoA := reg.Host + "/vols/spec-a"
	dA := push(t, repoA, repoA+":prod", srcA, smallChunks...)
	repoB := "oci:" + filepath.Join(t.TempDir(), "layout")
	dB := push(t, repoB, repoB+":v1", srcB, smallChunks...)

	dir := t.TempDir()
	spec := filepath.Join(dir, "bdnvol.yaml")
	yaml := "mounts:\n" +
		"  - source: " + repoA + ":prod\n    path: /models/a\n    readOnly: true\n" +
		"  - source: " + repoB + "@" + dB + "\n    path: /data/b\n    readOnly: true\n"
	if err := os.WriteFile(spec, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	mpA, mpB := filepath.Join(root, "models", "a"), filepath.Join(root, "data", "b")
	t.Cleanup(func() { forceUnmount(t, mpA); forceUnmount(t, mpB) })

	res := mustRun(t, "mount", "--daemon", "--prefetch", "none", "--spec", spec, root)
	lines := strings.Fields(res.stdout)
	if len(lines) != 2 || lines[0] != repoA+"@"+dA || lines[1] != repoB+"@"+dB {
		t.Fatalf("mount --spec printed %q, want the two pinned references\n%s", lines, res)
	}
	compareTrees(t, srcA, mpA)
	compareTrees(t, srcB, mpB)
	for mp, d := range map[string]string{mpA: dA, mpB: dB} {
		if got := getxattr(t, mp, "user.bdnvol.digest"); got != d {
			t.Errorf("%s: user.bdnvol.digest = %s, want %s", mp, got, d)
		}
		m, ok := findMount(t, mp)
		if !ok || m.Digest != d || m.PID == 0 {
			t.Errorf("bdnvol mounts: %s: %+v (found %v)", mp, m, ok)
		}
	}
	// One process serves the spec. umount of one of its mounts unmounts
	// that one only; the process serves the other on.
	pid := 0
	if m, ok := findMount(t, mpB); ok {
		pid = m.PID
	}
	mustRun(t, "umount", mpA)
	if _, ok := findMount(t, mpA); ok {
		t.Fatalf("after umount %s it is still listed", mpA)
	}
	if m, ok := findMount(t, mpB); !ok || m.PID != pid {
		t.Fatalf("after umount %s, %s: %+v (listed %v), want it still served by pid %d", mpA, mpB, m, ok, pid)
	}
	compareTrees(t, srcB, mpB)
	// umount of the spec's root unmounts what is left, and the process ends.
	mustRun(t, "umount", root)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, b := findMount(t, mpB)
		if !b && syscall.Kill(pid, 0) != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after umount %s: %s still mounted: %v, pid %d still alive", root, mpB, b, pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res := run(t, "umount", root); res.code == 0 {
		t.Fatalf("umount of a root with nothing mounted under it succeeded:\n%s", res)
	}
}

func TestMountSpecRefusesBadSpecs(t *testing.T) {
	dir := t.TempDir()
	for name, yaml := range map[string]string{
		"nested": "mounts:\n  - source: oci:" + dir + "/l:v1\n    path: /m\n  - source: oci:" + dir + "/l:v2\n    path: /m/inner\n",
		"no tag": "mounts:\n  - source: oci:" + dir + "/l\n    path: /m\n",
		"empty":  "mounts: []\n",
	} {
		spec := filepath.Join(dir, "bdnvol.yaml")
		if err := os.WriteFile(spec, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		if res := run(t, "mount", "--spec", spec, filepath.Join(dir, "root")); res.code != 2 {
			t.Errorf("%s: exit %d, want 2 (usage)\n%s", name, res.code, res)
		}
	}
	if res := run(t, "mount", "--spec", filepath.Join(dir, "bdnvol.yaml"), filepath.Join(dir, "root"), filepath.Join(dir, "extra")); res.code != 2 {
		t.Errorf("--spec with two arguments: exit %d, want 2\n%s", res.code, res)
	}
}
