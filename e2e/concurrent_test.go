package e2e

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestConcurrentPushesSameTag pushes two different trees to one tag of a
// registry at the same time: both succeed and are sealed, both pull by
// digest, the tag points at one of them and versions lists both.
func TestConcurrentPushesSameTag(t *testing.T) {
	for _, kind := range []string{"distribution", "ggcr"} {
		t.Run(kind, func(t *testing.T) {
			var reg *registry
			if kind == "ggcr" {
				reg = newGGCR(t)
			} else {
				reg = newDistribution(t)
			}
			testConcurrentPushes(t, target{name: kind, reg: reg})
		})
	}
}

func testConcurrentPushes(t *testing.T, tg target) {
	var srcs [2]string
	for i := range srcs {
		srcs[i] = filepath.Join(t.TempDir(), "src")
		buildTree(t, srcs[i], []node{
			fileNode("weights.bin", 0o644, randBytes(uint64(700+i), 3<<20)),
			fileNode("shared.bin", 0o644, randBytes(799, 1<<20)),
			fileNode("which.txt", 0o644, []byte{'a' + byte(i), '\n'}),
		}, time.Time{})
	}
	repo := tg.repo("vols/race")
	var (
		wg   sync.WaitGroup
		ress [2]result
	)
	for i := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append(append([]string{"push", "--json"}, smallChunks...), repo+":prod", srcs[i])
			ress[i] = run(t, args...)
		}()
	}
	wg.Wait()
	var digests [2]string
	for i, res := range ress {
		if res.code != 0 {
			t.Fatalf("concurrent push %d failed:\n%s", i, res)
		}
		var pr pushResult
		mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &pr)
		digests[i] = pr.Digest
	}
	if digests[0] == digests[1] {
		t.Fatalf("test data: both trees sealed as %s", digests[0])
	}
	for i, d := range digests {
		dst := filepath.Join(t.TempDir(), "dst")
		pull(t, repo+"@"+d, dst)
		compareTrees(t, srcs[i], dst)
	}
	got := strings.TrimSpace(mustRun(t, "resolve", repo+":prod").lastLine())
	if got != repo+"@"+digests[0] && got != repo+"@"+digests[1] {
		t.Errorf("prod resolves to %q, want one of %v", got, digests)
	}
	var vs []versionJSON
	mustJSON(t, []byte(mustRun(t, "versions", "--json", repo).stdout), &vs)
	for _, d := range digests {
		found := false
		for _, v := range vs {
			found = found || v.Digest == d
		}
		if !found {
			t.Errorf("versions --json does not list %s: %+v", d, vs)
		}
	}
	// The tag's target pulls whole, as the tree that was pushed there.
	dst := filepath.Join(t.TempDir(), "prod")
	pull(t, repo+":prod", dst)
	if got == repo+"@"+digests[0] {
		compareTrees(t, srcs[0], dst)
	} else {
		compareTrees(t, srcs[1], dst)
	}
}
