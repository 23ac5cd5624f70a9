package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPullOverExisting pulls into a DIR that already holds entries in the
// way: symlinks leading out of DIR where the version has a directory or a
// file, a file of the right size with the wrong bytes. The pull must put
// the version's entries in place and must not write through the symlinks.
func TestPullOverExisting(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		src := filepath.Join(t.TempDir(), "src")
		buildTree(t, src, []node{
			dirNode("sub", 0o755),
			fileNode("sub/f", 0o644, []byte("sub file")),
			fileNode("f1", 0o644, []byte("right bytes")),
			fileNode("f2", 0o600, []byte("not through the link")),
			linkNode("l", "f1"),
		}, time.Time{})
		repo := tg.repo("vols/over")
		d := push(t, repo, repo+":v1", src)

		s := newPullSite(t)
		buildTree(t, s.dst, []node{
			linkNode("sub", "../../outside"),
			fileNode("f1", 0o644, []byte("wrong bytes")), // same size as "right bytes"
			linkNode("f2", "../../outside/keep"),
			linkNode("l", "../../outside"),
		}, time.Time{})
		s.before = snapshot(t, s.base, s.dst)

		res := run(t, "pull", repo+"@"+d, s.dst)
		if res.code != 0 {
			t.Fatalf("pull over an existing DIR failed:\n%s", res)
		}
		if diffs := diffSnapshots(s.before, snapshot(t, s.base, s.dst)); len(diffs) > 0 {
			t.Errorf("pull changed things outside DIR:\n  %s", strings.Join(diffs, "\n  "))
		}
		want, got := snapshot(t, src), snapshot(t, s.dst)
		for p, w := range want {
			if got[p] != w {
				t.Errorf("%q: got %v, want %v", p, got[p], w)
			}
		}
	})
}

// TestPullKeepsNonEmptyDir pulls a version with a file where DIR holds a
// non-empty directory: the pull may replace it or refuse, but if it refuses
// it says so on one line naming the path, exits 1 and loses nothing.
func TestPullKeepsNonEmptyDir(t *testing.T) {
	tg := target{name: "oci-layout", root: t.TempDir()}
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, []node{fileNode("was-dir", 0o644, []byte("now a file"))}, time.Time{})
	repo := tg.repo("vols/over")
	d := push(t, repo, repo+":v1", src)
	s := newPullSite(t)
	buildTree(t, s.dst, []node{fileNode("was-dir/inner", 0o644, []byte("inner"))}, time.Time{})
	before := snapshot(t, s.dst)

	res := run(t, "pull", repo+"@"+d, s.dst)
	if res.code == 0 {
		compareTrees(t, src, s.dst)
		return
	}
	if res.code != 1 {
		t.Errorf("exit code %d, want 0 or 1:\n%s", res.code, res)
	}
	if line := oneLine(t, res); !strings.Contains(line, "was-dir") {
		t.Errorf("stderr does not name the path in the way: %q", line)
	}
	after := snapshot(t, s.dst)
	for p, e := range before {
		if after[p] != e {
			t.Errorf("refused pull changed %q: %v, was %v", p, after[p], e)
		}
	}
	for p, e := range after {
		if _, ok := before[p]; !ok {
			t.Logf("refused pull left %q (%v)", p, e)
		}
	}
}
