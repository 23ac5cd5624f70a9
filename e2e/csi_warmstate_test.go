package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	publishWarm := func(p pod, key string, publish, readOnly bool) error {
		t.Helper()
		req := &csi.NodePublishVolumeRequest{
			VolumeId: p.volumeID, TargetPath: p.target, Readonly: readOnly,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			},
			VolumeContext: map[string]string{
				"ref": pinned, "warmstateKey": key, "warmstatePublish": fmt.Sprint(publish),
				"csi.storage.k8s.io/pod.name": p.name, "csi.storage.k8s.io/pod.namespace": "e2e",
				"csi.storage.k8s.io/ephemeral": "true",
			},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err := n.Node.NodePublishVolume(ctx, req)
		return err
	}
	warm := func(p pod, key string, publish bool) {
		t.Helper()
		if err := publishWarm(p, key, publish, false); err != nil {
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
	// Publishing pods' caches is the operator's choice: off by default.
	if err := publishWarm(a, key, true, false); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("warmstatePublish on a node without --warmstate-publish: %v", err)
	}
	n.restartNodeWith("--warmstate-publish")
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

	// CSI's readonly: the companion as it is, read-only; asking it to
	// publish is refused.
	ro := n.newPod("ro")
	if err := publishWarm(ro, key, true, true); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("read-only with warmstatePublish: %v", err)
	}
	if err := publishWarm(ro, key, false, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ro.target, first.Hash, "rank_0", "compiled_at")); err != nil {
		t.Fatalf("read-only pod: %v", err)
	}
	if err := os.WriteFile(filepath.Join(ro.target, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write in a read-only warm-state volume: %v", err)
	}

	// A key off by one field (the driver) gets an empty directory.
	e := n.newPod("e")
	warm(e, strings.Replace(key, "driver=550", "driver=560", 1), false)
	if got := names(e.target); len(got) != 0 {
		t.Fatalf("pod with another driver's key: %v, want empty", got)
	}
	for _, p := range []pod{b, d, e, ro} {
		if err := n.unpublish(p); err != nil {
			t.Fatal(err)
		}
	}
	if cs := warmLs(t, pinned); len(cs) != 1 {
		t.Fatalf("pods that did not ask published: %+v", cs)
	}

	// The node supplies its GPU fields: a key without them finds the
	// companion; one naming another driver than the node's is refused.
	n.restartNodeWith("--warmstate-publish", "--warmstate-field", "gpu=NVIDIA-H100-80GB-HBM3", "--warmstate-field", "cc=9.0", "--warmstate-field", "driver=550")
	var short []string
	for _, f := range strings.Split(key, ",") {
		if !strings.HasPrefix(f, "gpu=") && !strings.HasPrefix(f, "cc=") && !strings.HasPrefix(f, "driver=") {
			short = append(short, f)
		}
	}
	g := n.newPod("g")
	warm(g, strings.Join(short, ","), false)
	if again := runStub(t, stub, g.target, args...); again.Mode != "loaded" {
		t.Fatalf("pod with the node's fields: %+v", again)
	}
	h := n.newPod("h")
	if err := publishWarm(h, strings.Join(append(short, "driver=560"), ","), false, false); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a key naming another driver than the node's: %v", err)
	}
	if err := n.unpublish(g); err != nil {
		t.Fatal(err)
	}
}

// TestCSIWarmStateSigned: under requireSignature, a companion the node
// published (unsigned) is not used: the pod gets an empty directory and
// starts, compiling; once a signed companion of the key is there, pods load it.
func TestCSIWarmStateSigned(t *testing.T) {
	stub := enginestub(t)
	n := startCSI(t, time.Minute)
	n.restartNodeWith("--warmstate-publish")
	reg := newDistribution(t)
	repo := reg.Host + "/models/warmsigned"
	v := pushJSON(t, repo+":v1", smallVolume(t, 1))
	pinned := repo + "@" + v.Digest
	priv, pub := keyPair(t, t.TempDir(), "warm")
	if r := signRun(t, "sign", "--key", priv, pinned); r.code != 0 {
		t.Fatalf("sign:\n%s", r)
	}
	pem, err := os.ReadFile(pub)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-tp", "1"}
	key := stubKey(t, stub, args...)
	attrs := func(publish bool) map[string]string {
		return map[string]string{"warmstateKey": key, "warmstatePublish": fmt.Sprint(publish), "requireSignature": string(pem)}
	}
	publish := func(p pod, publish bool) {
		t.Helper()
		req := &csi.NodePublishVolumeRequest{
			VolumeId: p.volumeID, TargetPath: p.target,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			},
			VolumeContext: map[string]string{"ref": pinned, "csi.storage.k8s.io/pod.name": p.name, "csi.storage.k8s.io/pod.namespace": "e2e"},
		}
		for k, v := range attrs(publish) {
			req.VolumeContext[k] = v
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := n.Node.NodePublishVolume(ctx, req); err != nil {
			t.Fatalf("publish %s: %v", p.name, err)
		}
	}
	a := n.newPod("a")
	publish(a, true)
	if s := runStub(t, stub, a.target, args...); s.Mode != "compiled" {
		t.Fatalf("pod a: %+v", s)
	}
	if err := n.unpublish(a); err != nil {
		t.Fatal(err)
	}
	if cs := warmLs(t, pinned); len(cs) != 1 {
		t.Fatalf("node-published companions: %+v", cs)
	}
	b := n.newPod("b")
	publish(b, false)
	es, _ := os.ReadDir(b.target)
	if len(es) != 0 {
		t.Fatalf("pod b, requiring a signature, got the unsigned companion: %d entries", len(es))
	}
	if err := n.unpublish(b); err != nil {
		t.Fatal(err)
	}
	// Someone trusted publishes a signed companion of the key.
	root := t.TempDir()
	runStub(t, stub, root, args...)
	if r := signRun(t, "warmstate", "push", "--sign-key", priv, "--key", key, pinned, root); r.code != 0 {
		t.Fatalf("signed push:\n%s", r)
	}
	c := n.newPod("c")
	publish(c, false)
	if s := runStub(t, stub, c.target, args...); s.Mode != "loaded" {
		t.Fatalf("pod c did not load the signed companion: %+v", s)
	}
	if err := n.unpublish(c); err != nil {
		t.Fatal(err)
	}
}

// TestCSIWarmStateBounds: a companion's lower directory stays while a pod
// uses it and is removed once none has for --warmstate-lower-ttl (the
// next pod of the key pulls it again and loads); a pod whose layer holds
// more than --warmstate-max-bytes publishes nothing.
func TestCSIWarmStateBounds(t *testing.T) {
	stub := enginestub(t)
	n := startCSI(t, time.Minute)
	ttl := 2 * time.Second
	n.restartNodeWith("--warmstate-publish", "--warmstate-lower-ttl="+ttl.String(), "--warmstate-max-bytes=1MiB")
	reg := newDistribution(t)
	repo := reg.Host + "/models/warmbounds"
	v := pushJSON(t, repo+":v1", smallVolume(t, 1))
	pinned := repo + "@" + v.Digest
	args := []string{"-tp", "1"}
	key := stubKey(t, stub, args...)
	otherKey := strings.Replace(key, "driver=550", "driver=560", 1)
	warm := func(p pod, key string, publish bool) {
		t.Helper()
		req := &csi.NodePublishVolumeRequest{
			VolumeId: p.volumeID, TargetPath: p.target,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			},
			VolumeContext: map[string]string{"ref": pinned, "warmstateKey": key, "warmstatePublish": fmt.Sprint(publish),
				"csi.storage.k8s.io/pod.name": p.name, "csi.storage.k8s.io/pod.namespace": "e2e"},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := n.Node.NodePublishVolume(ctx, req); err != nil {
			t.Fatalf("publish %s: %v", p.name, err)
		}
	}
	unpublish := func(p pod) {
		t.Helper()
		if err := n.unpublish(p); err != nil {
			t.Fatal(err)
		}
	}

	// The stand-in's 26 MB layer is over the node's 1 MiB bound: the
	// unpublish publishes nothing.
	big := n.newPod("big")
	warm(big, key, true)
	if s := runStub(t, stub, big.target, args...); s.Mode != "compiled" {
		t.Fatalf("pod big: %+v", s)
	}
	unpublish(big)
	if cs := warmLs(t, pinned); len(cs) != 0 {
		t.Fatalf("a layer over --warmstate-max-bytes was published: %+v", cs)
	}

	// The companion pushed from outside; a pod of its key pulls it into a
	// lower directory of the node.
	root := t.TempDir()
	runStub(t, stub, root, args...)
	mustRun(t, "warmstate", "push", "--key", key, pinned, root)
	companion := warmLs(t, pinned)[0].Digest
	lower := filepath.Join(n.stateDir, "warm", "lower", strings.TrimPrefix(companion, "sha256:"))
	exists := func() bool {
		_, err := os.Stat(lower)
		return err == nil
	}
	a, b := n.newPod("a"), n.newPod("b")
	warm(a, key, false)
	warm(b, key, false)
	if !exists() {
		t.Fatalf("no lower directory %s while pods use it", lower)
	}
	// Pod b still uses it past the TTL: an unpublish's sweep keeps it.
	unpublish(a)
	time.Sleep(ttl + 500*time.Millisecond)
	c := n.newPod("c")
	warm(c, otherKey, false)
	unpublish(c)
	if !exists() {
		t.Fatal("the lower directory of a companion a pod uses was removed")
	}
	if s := runStub(t, stub, b.target, args...); s.Mode != "loaded" {
		t.Fatalf("pod b: %+v", s)
	}
	// Unused for the TTL: the next sweep removes it.
	unpublish(b)
	time.Sleep(ttl + 500*time.Millisecond)
	d := n.newPod("d")
	warm(d, otherKey, false)
	unpublish(d)
	if exists() {
		t.Fatalf("lower directory %s unused for more than the TTL is still there", lower)
	}
	// The next pod of the key pulls it again.
	e := n.newPod("e")
	warm(e, key, false)
	if s := runStub(t, stub, e.target, args...); s.Mode != "loaded" || !exists() {
		t.Fatalf("pod e after the sweep: %+v", s)
	}
	unpublish(e)
}

// TestCSIWarmStateWarmList: a warm list line `REF warmstate:KEY` makes
// the node plugin pull the companion before any pod asks: the first pod
// of the key loads it without a blob fetched from the registry, and the
// listed companion's directory outlives the TTL until the line goes.
func TestCSIWarmStateWarmList(t *testing.T) {
	stub := enginestub(t)
	n := startCSI(t, time.Minute)
	reg := newDistribution(t)
	repo := reg.Host + "/models/warmlisted"
	v := pushJSON(t, repo+":v1", smallVolume(t, 1))
	pinned := repo + "@" + v.Digest
	args := []string{"-tp", "1"}
	key := stubKey(t, stub, args...)
	root := t.TempDir()
	runStub(t, stub, root, args...)
	mustRun(t, "warmstate", "push", "--key", key, pinned, root)
	companion := warmLs(t, pinned)[0].Digest
	lower := filepath.Join(n.stateDir, "warm", "lower", strings.TrimPrefix(companion, "sha256:"))
	list := filepath.Join(t.TempDir(), "warm-list")
	// The version's own line is the mounter's; the node takes the companion's.
	mustWrite(t, list, []byte(fmt.Sprintf("# warm list\n%s\n%s warmstate:%s\n", pinned, repo+":v1", key)))
	ttl := time.Second
	n.restartNodeWith("--warm-list", list, "--warm-list-interval=300ms", "--warmstate-lower-ttl="+ttl.String())
	exists := func() bool {
		_, err := os.Stat(lower)
		return err == nil
	}
	deadline := time.Now().Add(time.Minute)
	for !exists() {
		if time.Now().After(deadline) {
			t.Fatalf("the listed companion was not pulled into %s", lower)
		}
		time.Sleep(100 * time.Millisecond)
	}
	warm := func(p pod, key string) {
		t.Helper()
		req := &csi.NodePublishVolumeRequest{
			VolumeId: p.volumeID, TargetPath: p.target,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			},
			VolumeContext: map[string]string{"ref": pinned, "warmstateKey": key,
				"csi.storage.k8s.io/pod.name": p.name, "csi.storage.k8s.io/pod.namespace": "e2e"},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := n.Node.NodePublishVolume(ctx, req); err != nil {
			t.Fatalf("publish %s: %v", p.name, err)
		}
	}
	blobs := func() int { return reg.Stats().Requests["GET blob"] }
	before := blobs()
	a := n.newPod("a")
	warm(a, key)
	if s := runStub(t, stub, a.target, args...); s.Mode != "loaded" {
		t.Fatalf("pod a: %+v", s)
	}
	if got := blobs() - before; got != 0 {
		t.Errorf("the first pod of a listed companion fetched %d blobs", got)
	}
	if err := n.unpublish(a); err != nil {
		t.Fatal(err)
	}
	// Listed: kept past the TTL through a sweep.
	time.Sleep(ttl + 500*time.Millisecond)
	b := n.newPod("b")
	warm(b, strings.Replace(key, "driver=550", "driver=560", 1))
	if err := n.unpublish(b); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("a listed companion's directory was swept")
	}
	// Off the list: the next sweep after the TTL removes it.
	mustWrite(t, list, []byte(pinned+"\n"))
	time.Sleep(ttl + time.Second)
	c := n.newPod("c")
	warm(c, strings.Replace(key, "driver=550", "driver=560", 1))
	if err := n.unpublish(c); err != nil {
		t.Fatal(err)
	}
	if exists() {
		t.Fatal("a companion taken off the warm list, unused past the TTL, is still on the node")
	}
}
