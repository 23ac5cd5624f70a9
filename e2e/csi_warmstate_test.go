package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCSIWarmState runs the real node plugin with warm-state volumes
// (warmstateKey): the first pod gets an empty writable directory, compiles
// into it, and its unpublish publishes the companion (warmstatePublish);
// a pod published meanwhile never sees its writes; a later pod gets the
// companion beneath its own writable layer and loads without compiling;
// what that pod adds reaches neither the companion nor the next pod; a key
// off by one field gets an empty directory.
func TestCSIWarmState(t *testing.T) {
	stub := enginestub(t)
	n := startCSI(t, time.Minute)
	reg := newDistribution(t)
	repo := reg.Host + "/models/warmcsi"
	v := pushJSON(t, repo+":v1", smallVolume(t, 1))
	pinned := repo + "@" + v.Digest
	args := []string{"-tp", "2", "-rank", "0"}
	key := stubKey(t, stub, args...)
	warm := func(p pod, key string, publish bool) {
		t.Helper()
		attrs := map[string]string{"warmstateKey": key}
		if publish {
			attrs["warmstatePublish"] = "true"
		}
		if err := n.publishWith(p, pinned, "", attrs); err != nil {
			t.Fatalf("publish %s: %v", p.name, err)
		}
	}
	names := func(dir string) []string {
		es, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}

	a, b := n.newPod("a"), n.newPod("b")
	warm(a, key, true)
	warm(b, key, false)
	if got := names(a.target); len(got) != 0 {
		t.Fatalf("first pod's warm-state directory: %v, want empty", got)
	}
	first := runStub(t, stub, a.target, args...)
	if first.Mode != "compiled" {
		t.Fatalf("first pod: %+v", first)
	}
	if got := names(b.target); len(got) != 0 {
		t.Fatalf("pod b sees pod a's writes: %v", got)
	}
	// Idempotent: kubelet may publish the same target again.
	warm(a, key, true)
	if err := n.unpublish(a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a.target, first.Hash)); err == nil {
		t.Fatalf("pod a's cache still at its target after unpublish")
	}
	cs := warmLs(t, pinned)
	if len(cs) != 1 || !sameKey(cs[0].Key, key) {
		t.Fatalf("companions after pod a's unpublish: %+v", cs)
	}
	companion := cs[0].Digest

	c := n.newPod("c")
	warm(c, key, true)
	second := runStub(t, stub, c.target, args...)
	if second.Mode != "loaded" {
		t.Fatalf("pod c did not load pod a's cache: %+v", second)
	}
	t.Logf("first pod's start %.2fs (compiled), later pod's %.2fs (loaded)", first.Seconds, second.Seconds)
	if err := os.WriteFile(filepath.Join(c.target, "extra"), []byte("pod c's"), 0o644); err != nil {
		t.Fatalf("pod c cannot write above the companion: %v", err)
	}
	if err := os.WriteFile(filepath.Join(c.target, first.Hash, "rank_0", "compiled_at"), []byte("changed"), 0o644); err != nil {
		t.Fatalf("pod c cannot change a file of the companion in its own layer: %v", err)
	}
	if err := n.unpublish(c); err != nil {
		t.Fatal(err)
	}
	if cs := warmLs(t, pinned); len(cs) != 1 || cs[0].Digest != companion {
		t.Fatalf("companions after pod c (a companion is never updated in place): %+v", cs)
	}
	d := n.newPod("d")
	warm(d, key, false)
	if _, err := os.Stat(filepath.Join(d.target, "extra")); err == nil {
		t.Fatal("pod d sees pod c's file")
	}
	if got, _ := os.ReadFile(filepath.Join(d.target, first.Hash, "rank_0", "compiled_at")); string(got) == "changed" {
		t.Fatal("pod d sees pod c's change")
	}
	if again := runStub(t, stub, d.target, args...); again.Mode != "loaded" {
		t.Fatalf("pod d: %+v", again)
	}

	// A key off by one field (the driver) gets an empty directory.
	e := n.newPod("e")
	warm(e, strings.Replace(key, "driver=550", "driver=560", 1), false)
	if got := names(e.target); len(got) != 0 {
		t.Fatalf("pod with another driver's key: %v, want empty", got)
	}
	for _, p := range []pod{b, d, e} {
		if err := n.unpublish(p); err != nil {
			t.Fatal(err)
		}
	}
	if cs := warmLs(t, pinned); len(cs) != 1 {
		t.Fatalf("pods that did not ask published: %+v", cs)
	}
}
