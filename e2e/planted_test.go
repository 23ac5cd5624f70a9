package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// oldTmpName is the temporary name bdnvol used to write next to the final
// name of p, before pulls kept temporaries in a private directory.
func oldTmpName(p string) string {
	h := sha256.Sum256([]byte(p))
	return ".bdnvol-" + hex.EncodeToString(h[:8]) + ".part"
}

// TestPullPlantedLinks pulls with the real CLI into a DIR where someone who
// can write to it planted symlinks and hard links to files outside: at the
// temporary names, at the final names, as a directory of the version and as
// the pull's private directory. Nothing outside DIR may change (contents,
// modes) and the pull must put the version in place, or fail clearly.
func TestPullPlantedLinks(t *testing.T) {
	tg := target{name: "oci-layout", root: t.TempDir()}
	secret := []byte("the version's f1\n")
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, []node{
		fileNode("f1", 0o600, secret),
		fileNode("f2", 0o644, []byte("f2\n")),
		dirNode("sub", 0o755),
		fileNode("sub/f3", 0o644, []byte("f3\n")),
		linkNode("l", "f1"),
	}, time.Time{})
	repo := tg.repo("vols/planted")
	d := push(t, repo, repo+":v1", src)

	s := newPullSite(t)
	out := s.outside
	buildTree(t, out, []node{
		fileNode("victim", 0o644, []byte("victim\n")),
		fileNode("victim2", 0o644, []byte("victim2\n")),
		fileNode("twin", 0o644, secret), // f1's bytes, another mode
	}, time.Time{})
	mustMkdir := func(p string) {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustMkdir(s.dst)
	plant := func(link bool, target, at string) {
		var err error
		if link {
			err = os.Symlink(target, filepath.Join(s.dst, at))
		} else {
			err = os.Link(target, filepath.Join(s.dst, at))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	plant(true, filepath.Join(out, "victim"), oldTmpName("f1"))
	plant(false, filepath.Join(out, "victim2"), oldTmpName("f2"))
	plant(true, filepath.Join(out, "victim"), "f2")
	plant(false, filepath.Join(out, "twin"), "f1")
	plant(true, out, "sub")
	plant(true, filepath.Join(out, "victim"), "l")
	plant(true, out, ".bdnvol-pull")
	s.before = snapshot(t, s.base, s.dst)

	res := run(t, "pull", repo+"@"+d, s.dst)
	if diffs := diffSnapshots(s.before, snapshot(t, s.base, s.dst)); len(diffs) > 0 {
		t.Errorf("pull changed things outside DIR:\n  %s", strings.Join(diffs, "\n  "))
	}
	if res.code != 0 {
		line := oneLine(t, res)
		t.Fatalf("pull failed (it may, but then only clearly): %s", line)
	}
	// The planted old temporaries are not the pull's: they stay, unfollowed.
	for _, p := range []string{oldTmpName("f1"), oldTmpName("f2")} {
		if err := os.Remove(filepath.Join(s.dst, p)); err != nil {
			t.Errorf("planted %s: %v", p, err)
		}
	}
	compareTrees(t, src, s.dst)
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(s.dst, "f1"), &st); err != nil || st.Nlink != 1 {
		t.Errorf("f1: %d links (%v): the hard link planted there was modified, not replaced", st.Nlink, err)
	}
}

// TestPullReservedNames pulls versions with entries named like bdnvol's own
// files in DIR: refused, naming the entry, with nothing changed outside.
func TestPullReservedNames(t *testing.T) {
	tg := target{name: "oci-layout", root: t.TempDir()}
	evil := []byte("evil\n")
	dir := func(p string) indexEntry { return indexEntry{Path: p, Type: "dir", Mode: 0o755} }
	for name, entries := range map[string][]indexEntry{
		"private-dir":    {dir(".bdnvol-pull"), fileEntry(".bdnvol-pull/"+strings.Repeat("0", 32)+".part", 0o644, evil, 0)},
		"private-file":   {fileEntry(".bdnvol-pull", 0o644, evil, 0)},
		"old-temporary":  {fileEntry("a", 0o644, evil, 0), fileEntry(oldTmpName("a"), 0o644, evil, 0)},
		"nested":         {dir("d"), fileEntry("d/.bdnvol-x", 0o644, evil, 0)},
		"layout-lock":    {fileEntry(".bdnvol-index.lock", 0o644, evil, 0)},
		"symlink-to-tmp": {link0(".bdnvol-pull", "a"), fileEntry("a", 0o644, evil, 0)},
	} {
		t.Run(name, func(t *testing.T) {
			sortEntries(entries)
			v := craft(t, fileIndex{Files: entries}, [][]byte{evil})
			repo := "hostile/reserved-" + name
			writeLayout(t, filepath.Join(tg.root, repo), "v1", v)
			s := newPullSite(t)
			res := run(t, "pull", tg.repo(repo)+":v1", s.dst)
			line := s.checkFailedPull(t, res, repo, []string{".bdnvol-"}, goodContents(v.index))
			if !strings.Contains(line, "bdnvol's own") {
				t.Errorf("the error does not say the name is reserved: %q", line)
			}
		})
	}
}

func link0(p, target string) indexEntry {
	return indexEntry{Path: p, Type: "symlink", Mode: 0o777, Target: target}
}

func sortEntries(es []indexEntry) {
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && es[j].Path < es[j-1].Path; j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}

// TestPushSymlinkRoot pushes DIR given as a symlink to a directory: the
// directory's contents are sealed (symlinks inside are still not followed).
func TestPushSymlinkRoot(t *testing.T) {
	tg := target{name: "oci-layout", root: t.TempDir()}
	base := t.TempDir()
	src := filepath.Join(base, "real")
	buildTree(t, src, []node{fileNode("a", 0o644, []byte("a\n")), linkNode("l", "a")}, time.Time{})
	if err := os.Symlink("real", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	repo := tg.repo("vols/linkroot")
	pr := pushJSON(t, repo+":v1", filepath.Join(base, "link"))
	if pr.Files != 2 {
		t.Fatalf("push of a symlink to a directory sealed %d entries, want 2", pr.Files)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	pull(t, repo+"@"+pr.Digest, dst)
	compareTrees(t, src, dst)
}

// TestPushInheritsSaneChunking: a version cut into 64-byte chunks does not
// make the next push (without chunk flags) cut into 64-byte chunks too.
func TestPushInheritsSaneChunking(t *testing.T) {
	tg := target{name: "oci-layout", root: t.TempDir()}
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, []node{fileNode("a", 0o644, randBytes(61, 4<<10))}, time.Time{})
	repo := tg.repo("vols/tiny")
	first := pushJSON(t, repo+":v1", src, "--chunk-min", "64", "--chunk-avg", "64", "--chunk-max", "64")
	if first.Chunks != 64 {
		t.Fatalf("premise: 4 KiB in 64-byte chunks is 64 chunks, got %d", first.Chunks)
	}
	buildTree(t, src, []node{fileNode("b", 0o644, randBytes(62, 256<<10))}, time.Time{})
	second := pushJSON(t, repo+":v2", src)
	if second.Chunks > 256 {
		t.Errorf("the next push cut 260 KiB into %d chunks: it inherited the 64-byte chunking", second.Chunks)
	}
	t.Logf("next push: %d chunks", second.Chunks)
}
