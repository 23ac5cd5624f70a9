package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// warmPod is a pod, running as nobody on the host's network, whose
// warm-state volume (the companion of key for ref, writable) is mounted at
// /cache; it prints how many entries /cache holds, runs the engine
// stand-in from the host directory stubDir (mounted at /stub) with args,
// and sleeps.
func warmPod(name, ref, key string, publish bool, stubDir string, args ...string) string {
	script := fmt.Sprintf(`echo entries=$(ls -A /cache | wc -l); /stub/enginestub -cache-root /cache -compile-time 1s %s || echo STUB-FAILED; echo READY; exec sleep 3600`,
		strings.Join(args, " "))
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
spec:
  hostNetwork: true
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  tolerations: [{operator: Exists}]
  securityContext: {runAsUser: 65534, runAsGroup: 65534, runAsNonRoot: true}
  containers:
    - name: engine
      image: %s
      imagePullPolicy: Never
      command: ["sh", "-c", %s]
      volumeMounts:
        - {name: cache, mountPath: /cache}
        - {name: stub, mountPath: /stub, readOnly: true}
  volumes:
    - name: cache
      csi:
        driver: %s
        volumeAttributes:
          ref: %s
          warmstateKey: %s
          warmstatePublish: "%v"
    - name: stub
      hostPath: {path: %s, type: Directory}
`, name, imgBusybox, jsonString(script), driverName, jsonString(ref), jsonString(key), publish, stubDir)
}

// testClusterWarmState runs the engine stand-in in pods with warm-state
// volumes: the first pod gets an empty directory and compiles; deleting it
// publishes its cache (the node plugin runs with --warmstate-publish); a
// second pod of the same key gets that cache and loads without compiling;
// a pod whose key differs in one field (the driver) gets an empty
// directory and compiles.
func testClusterWarmState(t *testing.T, c *cluster, reg *registry) {
	// A static stand-in in a host directory the pods (nobody) can read.
	stubDir, err := os.MkdirTemp("", "bdnvol-e2e-stub-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stubDir) })
	if err := os.Chmod(stubDir, 0o755); err != nil {
		t.Fatal(err)
	}
	stub := filepath.Join(stubDir, "enginestub")
	build := exec.Command("go", "build", "-trimpath", "-o", stub, "./cmd/enginestub")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build enginestub: %v\n%s", err, b)
	}

	src := t.TempDir()
	mustWrite(t, filepath.Join(src, "config.json"), []byte(`{"model": "stub-model"}`))
	ref := reg.Host + "/team/warmstate:v1"
	mustRun(t, "push", ref, src)
	args := []string{"-tp", "2", "-rank", "0"}
	key := stubKey(t, stub, args...)

	started := func(pod string) (int, stubStart) {
		t.Helper()
		c.waitFor("pod "+pod+" to print READY", func() (bool, string) {
			l := c.podLogs("default", pod)
			return strings.Contains(l, "READY"), l + c.events("default", pod)
		})
		l := c.podLogs("default", pod)
		entries := -1
		var s stubStart
		for _, line := range strings.Split(l, "\n") {
			if n, ok := strings.CutPrefix(line, "entries="); ok {
				fmt.Sscan(n, &entries)
			}
			if strings.HasPrefix(line, "{") {
				if err := json.Unmarshal([]byte(line), &s); err != nil {
					t.Fatalf("pod %s: stand-in output %q: %v", pod, line, err)
				}
			}
		}
		if s.Mode == "" {
			t.Fatalf("pod %s: no output of the stand-in:\n%s", pod, l)
		}
		return entries, s
	}

	c.apply(warmPod("warm-first", ref, key, true, stubDir, args...))
	entries, first := started("warm-first")
	if entries != 0 || first.Mode != "compiled" {
		t.Fatalf("first pod: %d entries in its cache directory, stand-in %+v; want an empty directory and a compile", entries, first)
	}
	if cs := warmLs(t, ref); len(cs) != 0 {
		t.Fatalf("companions while the first pod runs: %+v", cs)
	}
	// Deleting the pod unpublishes its volume: the node plugin publishes
	// what the pod compiled.
	c.kubectl("delete", "pod", "warm-first")
	c.waitFor("the first pod's cache to be published", func() (bool, string) {
		res := run(t, "warmstate", "ls", "--json", ref)
		return res.code == 0 && strings.Contains(res.stdout, `"digest"`), res.String()
	})
	cs := warmLs(t, ref)
	if len(cs) != 1 || !sameKey(cs[0].Key, key) {
		t.Fatalf("companions after the first pod: %+v", cs)
	}
	companion := cs[0].Digest

	c.apply(warmPod("warm-second", ref, key, true, stubDir, args...))
	entries, second := started("warm-second")
	if second.Mode != "loaded" || second.Hash != first.Hash || entries != 1 {
		t.Fatalf("second pod: %d entries, stand-in %+v; want the first pod's cache (%s) loaded", entries, second, first.Hash)
	}
	t.Logf("stand-in start in the first pod %.2fs (compiled), in the second %.2fs (loaded)", first.Seconds, second.Seconds)

	// The key with another driver: nothing of the first pod's.
	other := strings.Replace(key, "driver=550", "driver=560", 1)
	if other == key {
		t.Fatalf("the stand-in's key %q has no driver=550", key)
	}
	c.apply(warmPod("warm-other", ref, other, false, stubDir, append(args, "-driver", "560")...))
	entries, third := started("warm-other")
	if entries != 0 || third.Mode != "compiled" {
		t.Fatalf("pod of another driver's key: %d entries, stand-in %+v; want an empty directory and a compile", entries, third)
	}
	c.kubectl("delete", "pod", "warm-second", "warm-other")
	// The second pod asked to publish too: a companion existed, so
	// nothing is; the other pod did not ask.
	if cs := warmLs(t, ref); len(cs) != 1 || cs[0].Digest != companion {
		t.Fatalf("companions after the other pods: %+v", cs)
	}
}
