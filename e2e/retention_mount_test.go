package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// A version that a running mount on this machine serves is never deleted
// by gc, even when no tag or file keeps it; once unmounted, it goes.
func TestRetentionKeepsMountedVersion(t *testing.T) {
	requireFUSE(t)
	reg := newDistribution(t)
	repo := reg.Host + "/team/mounted"
	var refs []string
	for i, content := range []string{"first version", "second version"} {
		dir := t.TempDir()
		mustWrite(t, dir+"/data.txt", []byte(content))
		res := mustRun(t, "push", repo, dir)
		refs = append(refs, res.lastLine())
		if !strings.Contains(refs[i], "@sha256:") {
			t.Fatalf("push printed %q", refs[i])
		}
	}
	old := refs[0][strings.Index(refs[0], "@")+1:]
	mp := mount(t, refs[0])

	type plan struct {
		Plan struct {
			Versions []struct {
				Digest  string `json:"digest"`
				Action  string `json:"action"`
				Reasons []struct {
					Kind string `json:"kind"`
					Text string `json:"text"`
				} `json:"reasons"`
			} `json:"versions"`
		} `json:"plan"`
	}
	decide := func(args ...string) (action string, why string) {
		t.Helper()
		var p plan
		res := mustRun(t, append([]string{"gc", repo, "--keep-last", "1", "--json"}, args...)...)
		if err := json.Unmarshal([]byte(res.stdout), &p); err != nil {
			t.Fatalf("gc --json: %v\n%s", err, res)
		}
		for _, d := range p.Plan.Versions {
			if d.Digest == old {
				var kinds []string
				for _, r := range d.Reasons {
					kinds = append(kinds, r.Kind+": "+r.Text)
				}
				return d.Action, strings.Join(kinds, "; ")
			}
		}
		t.Fatalf("the plan does not list %s:\n%s", old, res)
		return "", ""
	}
	if action, why := decide("--apply"); action != "keep" || !strings.Contains(why, "mount") || !strings.Contains(why, mp) {
		t.Fatalf("while mounted at %s: %s (%s), want keep because of the mount", mp, action, why)
	}
	if vs := mustRun(t, "versions", repo).stdout; !strings.Contains(vs, old) {
		t.Fatalf("the mounted version is no longer listed:\n%s", vs)
	}
	forceUnmount(t, mp)
	if action, why := decide("--apply"); action != "delete" {
		t.Fatalf("after unmounting: %s (%s), want delete", action, why)
	}
	if vs := mustRun(t, "versions", repo).stdout; strings.Contains(vs, old) {
		t.Fatalf("the deleted version is still listed:\n%s", vs)
	}
}
