package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// listDir is the sorted names in dir, and whether something is mounted
// at or under it.
func listDir(t *testing.T, dir string) ([]string, bool) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	mounted := false
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mounted = true
		}
	}
	return names, mounted
}

// TestCSITargetsConfined: target paths with "..", outside the kubelet
// directory, through a symlink, at a file or a non-empty directory are refused
// with InvalidArgument, and nothing outside the kubelet directory changes;
// the volume was bound there before.
func TestCSITargetsConfined(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/vols/confined"
	src, _, _ := csiVersions(t, repo)
	n := startCSI(t, time.Minute)

	outside := t.TempDir() // not beneath the kubelet directory (n.root)
	if err := os.WriteFile(filepath.Join(outside, "keep.txt"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(n.root, outside)
	if err != nil {
		t.Fatal(err)
	}
	link := n.newPod("link")
	if err := os.Symlink(outside, link.target); err != nil {
		t.Fatal(err)
	}
	mid := n.newPod("mid") // a symlink on the way: .../vol -> outside
	midDir := filepath.Dir(mid.target)
	os.Remove(midDir)
	if err := os.Symlink(outside, midDir); err != nil {
		t.Fatal(err)
	}
	full := n.newPod("full")
	if err := os.MkdirAll(full.target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(full.target, "data.txt"), []byte("pod data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := n.newPod("file")
	if err := os.WriteFile(file.target, []byte("a file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		target string
	}{
		{"file", file.target},
		{"dotdot staying inside", n.root + "/pods/" + rel + "/dotdot"},
		{"dotdot lexical", filepath.Join(n.root, "pods", "x") + "/../../" + rel + "/mount"},
		{"outside", filepath.Join(outside, "mount")},
		{"relative", "pods/rel/mount"},
		{"symlink target", link.target},
		{"symlink on the way", mid.target},
		{"non-empty dir", full.target},
	} {
		p := pod{name: c.name, volumeID: "csi-" + strings.ReplaceAll(c.name, " ", "-"), target: c.target}
		err := n.publish(p, repo+":prod", "")
		if codeOf(err) != codes.InvalidArgument {
			t.Errorf("%s (%s): %v, want InvalidArgument", c.name, c.target, err)
			n.unpublish(p)
		}
		names, mounted := listDir(t, outside)
		if !slices.Equal(names, []string{"keep.txt"}) || mounted {
			t.Fatalf("%s: outside the kubelet directory now %v, mounted %v", c.name, names, mounted)
		}
	}
	if names, mounted := listDir(t, full.target); !slices.Equal(names, []string{"data.txt"}) || mounted {
		t.Errorf("the non-empty directory is now %v, mounted %v", names, mounted)
	}
	if b, err := os.ReadFile(file.target); err != nil || string(b) != "a file\n" {
		t.Errorf("the file at the target is now %q, %v", b, err)
	}
	// A proper target still works.
	good := n.newPod("good")
	n.mustPublish(good, repo+":prod", "")
	compareTrees(t, src, good.target)
	if err := n.unpublish(good); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(good.target); !os.IsNotExist(err) {
		t.Errorf("target left after unpublish: %v", err)
	}
}

// TestCSIUnpublishOnlyRecorded: NodeUnpublishVolume leaves alone what the
// plugin did not publish: a regular file at the target, a user's own
// `bdnvol mount` there, and the mounter's own mountpoint (whose detach
// broke every pod on the digest and later publishes).
func TestCSIUnpublishOnlyRecorded(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/vols/recorded"
	src, _, _ := csiVersions(t, repo)
	n := startCSI(t, time.Minute)
	a := n.newPod("a")
	n.mustPublish(a, repo+":prod", "")
	compareTrees(t, src, a.target)

	file := n.newPod("file")
	if err := os.WriteFile(file.target, []byte("not a volume\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.unpublish(file); err != nil {
		t.Errorf("unpublish of a file target: %v", err)
	}
	if b, err := os.ReadFile(file.target); err != nil || string(b) != "not a volume\n" {
		t.Errorf("the file at the target: %q, %v", b, err)
	}

	user := n.newPod("user")
	if err := os.Mkdir(user.target, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forceUnmount(t, user.target) })
	mustRun(t, "mount", "--daemon", repo+":prod", user.target)
	if err := n.unpublish(user); err != nil {
		t.Errorf("unpublish of a user's mount: %v", err)
	}
	if _, ok := findMount(t, user.target); !ok {
		t.Error("the user's own bdnvol mount was unmounted")
	} else {
		compareTrees(t, src, user.target)
	}

	ms := n.fuseMounts()
	if len(ms) != 1 {
		t.Fatalf("FUSE mounts %v, want one", ms)
	}
	for mp := range ms {
		err := n.unpublish(pod{name: "mounter", volumeID: "csi-mounter", target: mp})
		t.Logf("unpublish of the mounter's mountpoint: %v", err)
		if got := n.fuseMounts(); len(got) != 1 {
			t.Errorf("the mounter's mount was detached: %v", got)
		}
	}
	compareTrees(t, src, a.target)
	b := n.newPod("b")
	n.mustPublish(b, repo+":prod", "")
	compareTrees(t, src, b.target)
}
