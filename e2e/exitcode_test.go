package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{},
		{"push"},
		{"pull"},
		{"pull", "127.0.0.1:1/repo:tag"},
		{"push", "--no-such-flag", "127.0.0.1:1/repo:tag", dir},
		{"pull", "--no-such-flag", "127.0.0.1:1/repo:tag", dir},
		{"push", "--chunk-avg", "banana", "127.0.0.1:1/repo:tag", dir},
		{"push", "--max-layers", "many", "127.0.0.1:1/repo:tag", dir},
		{"no-such-command"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			res := run(t, args...)
			if res.code != 2 {
				t.Errorf("want exit code 2 (usage error):\n%s", res)
			}
			if strings.TrimSpace(res.stderr) == "" {
				t.Errorf("usage error with nothing on stderr:\n%s", res)
			}
		})
	}
}

func TestMissingReference(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		src := t.TempDir()
		buildTree(t, src, []node{fileNode("f", 0o644, []byte("f"))}, time.Time{})
		repo := tg.repo("vols/present")
		pr := pushJSON(t, repo+":v1", src)
		missingDigest := "sha256:" + strings.Repeat("0", 64)
		for _, c := range []struct{ ref, named string }{
			{repo + ":nope", repo + ":nope"},
			{repo + "@" + missingDigest, repo + "@" + missingDigest},
			// A repository or layout that does not exist: naming it is enough.
			{tg.repo("vols/absent") + ":v1", tg.repo("vols/absent")},
		} {
			ref := c.ref
			t.Run(strings.TrimPrefix(ref, tg.repo("")), func(t *testing.T) {
				s := newPullSite(t)
				res := run(t, "pull", ref, s.dst)
				if res.code != 1 {
					t.Errorf("want exit code 1:\n%s", res)
				}
				line := oneLine(t, res)
				if !strings.Contains(line, strings.TrimPrefix(c.named, "oci:")) {
					t.Errorf("stderr does not name %s: %q", c.named, line)
				}
				t.Logf("stderr: %s", line)
				if diffs := diffSnapshots(s.before, snapshot(t, s.base, s.dst)); len(diffs) > 0 {
					t.Errorf("failed pull changed things outside DIR: %v", diffs)
				}
			})
		}
		// The version is still there under its tag.
		dst := filepath.Join(t.TempDir(), "dst")
		pull(t, repo+"@"+pr.Digest, dst)
		compareTrees(t, src, dst)
	})
}
