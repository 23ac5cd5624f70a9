package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// codeOf is the gRPC code of err.
func codeOf(err error) codes.Code { return status.Code(err) }

// waitReadable returns how long until a file under target can be read.
func waitReadable(t *testing.T, p string) {
	t.Helper()
	if _, err := os.ReadFile(p); err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
}

// csiVersions pushes two versions of one repository behind reg and returns
// their trees and digests.
func csiVersions(t *testing.T, repo string) (v1, v2, d1 string) {
	t.Helper()
	v1 = filepath.Join(t.TempDir(), "v1")
	v2 = filepath.Join(t.TempDir(), "v2")
	buildTree(t, v1, richTree(), time.Time{})
	buildTree(t, v2, []node{fileNode("weights.bin", 0o644, randBytes(21, 600<<10)), fileNode("version.txt", 0o644, []byte("two\n"))}, time.Time{})
	d1 = push(t, repo, repo+":prod", v1, smallChunks...)
	return v1, v2, d1
}

// TestCSIKubeletPlay plays kubelet: three pods on one tag share one FUSE
// mount and fetch every chunk once; the tag moves and a fourth pod gets the
// new digest while the first three keep theirs; unpublish refcounts and the
// last one unmounts after the linger; the mount is read-only.
func TestCSIKubeletPlay(t *testing.T) {
	reg := newDistribution(t)
	proxy := newFaultProxy(t, reg) // counts blob GETs by digest
	repo := proxy.Host + "/vols/llama"
	v1, v2, d1 := csiVersions(t, repo)
	const linger = 1500 * time.Millisecond
	n := startCSI(t, linger)
	proxy.Set(faultConfig{})

	pods := []pod{n.newPod("a"), n.newPod("b"), n.newPod("c")}
	var cold, warm time.Duration
	for i, p := range pods {
		start := time.Now()
		n.mustPublish(p, repo+":prod", "")
		waitReadable(t, filepath.Join(p.target, "readme.txt"))
		if i == 0 {
			cold = time.Since(start)
		} else {
			warm += time.Since(start)
		}
	}
	warm /= time.Duration(len(pods) - 1)
	t.Logf("MEASURE publish→readable: cold %v, digest already mounted %v", cold.Round(time.Microsecond), warm.Round(time.Microsecond))
	for _, p := range pods {
		compareTrees(t, v1, p.target)
		if got := getxattr(t, p.target, "user.bdnvol.digest"); got != d1 {
			t.Errorf("%s: user.bdnvol.digest = %s, want %s", p.name, got, d1)
		}
	}
	if ms := n.fuseMounts(); len(ms) != 1 {
		t.Fatalf("three pods on one digest: %d FUSE mounts %v, want 1", len(ms), ms)
	}
	gets := proxy.blobGets()
	if len(gets) == 0 {
		t.Fatal("the proxy saw no blob GET")
	}
	var max, total int
	for d, c := range gets {
		total += c
		if c > max {
			max = c
		}
		if c != 1 {
			t.Errorf("blob %s fetched %d times by three pods, want once", d, c)
		}
	}
	t.Logf("MEASURE registry fetches per chunk with 3 pods: %.2f (%d GETs of %d blobs, max %d)", float64(total)/float64(len(gets)), total, len(gets), max)

	// The mount is read-only.
	if err := os.WriteFile(filepath.Join(pods[0].target, "new.txt"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("creating a file in the volume: %v, want EROFS", err)
	}
	if f, err := os.OpenFile(filepath.Join(pods[0].target, "readme.txt"), os.O_WRONLY, 0); !errors.Is(err, syscall.EROFS) {
		t.Errorf("opening a file for writing: %v, want EROFS", err)
		if f != nil {
			f.Close()
		}
	}
	if err := os.Remove(filepath.Join(pods[0].target, "readme.txt")); !errors.Is(err, syscall.EROFS) {
		t.Errorf("removing a file: %v, want EROFS", err)
	}

	// Publishing the same target again is a no-op.
	n.mustPublish(pods[0], repo+":prod", "")

	// Volume stats: the volume's size.
	st, err := n.Node.NodeGetVolumeStats(context.Background(), &csi.NodeGetVolumeStatsRequest{VolumeId: pods[0].volumeID, VolumePath: pods[0].target})
	if err != nil {
		t.Fatal(err)
	}
	var wantBytes, wantFiles int64
	filepath.Walk(v1, func(p string, fi os.FileInfo, err error) error {
		if p != v1 {
			wantFiles++
			if fi.Mode().IsRegular() {
				wantBytes += fi.Size()
			}
		}
		return nil
	})
	for _, u := range st.Usage {
		switch u.Unit {
		case csi.VolumeUsage_BYTES:
			if u.Total != wantBytes {
				t.Errorf("stats: %d bytes, want %d", u.Total, wantBytes)
			}
		case csi.VolumeUsage_INODES:
			if u.Total != wantFiles {
				t.Errorf("stats: %d inodes, want %d", u.Total, wantFiles)
			}
		}
	}

	// The tag moves: a fourth pod gets the new digest, the first three keep theirs.
	d2 := push(t, repo, repo+":prod", v2, smallChunks...)
	p4 := n.newPod("d")
	n.mustPublish(p4, repo+":prod", "")
	compareTrees(t, v2, p4.target)
	if got := getxattr(t, p4.target, "user.bdnvol.digest"); got != d2 {
		t.Errorf("fourth pod: user.bdnvol.digest = %s, want the new %s", got, d2)
	}
	for _, p := range pods {
		if got := getxattr(t, p.target, "user.bdnvol.digest"); got != d1 {
			t.Errorf("%s after the tag moved: user.bdnvol.digest = %s, want %s", p.name, got, d1)
		}
		compareTrees(t, v1, p.target)
	}
	if ms := n.fuseMounts(); len(ms) != 2 {
		t.Fatalf("two digests: %d FUSE mounts %v, want 2", len(ms), ms)
	}
	if !n.nodeLog.waitFor(10*time.Second, `"msg":"published"`, d2) {
		t.Errorf("no published log line with %s:\n%s", d2, n.nodeLog)
	}

	// Unpublish refcounts: the mount of d1 stays until the last pod and the linger.
	for _, p := range pods[:2] {
		if err := n.unpublish(p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p.target); !os.IsNotExist(err) {
			t.Errorf("%s: target path left after unpublish: %v", p.name, err)
		}
	}
	compareTrees(t, v1, pods[2].target)
	if ms := n.fuseMounts(); len(ms) != 2 {
		t.Fatalf("after two of three unpublished: FUSE mounts %v, want both digests", ms)
	}
	if err := n.unpublish(pods[2]); err != nil {
		t.Fatal(err)
	}
	if ms := n.fuseMounts(); len(ms) != 2 {
		t.Errorf("right after the last unpublish (linger %v): FUSE mounts %v, want d1 still mounted", linger, ms)
	}
	// A pod restarted within the linger reuses the mount: nothing fetched.
	proxy.Set(faultConfig{})
	p5 := n.newPod("e")
	n.mustPublish(p5, repo+"@"+d1, "")
	compareTrees(t, v1, p5.target)
	if g := proxy.blobGets(); len(g) != 0 {
		t.Errorf("republishing within the linger fetched %v", g)
	}
	if err := n.unpublish(p5); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(linger + 10*time.Second)
	for {
		ms := n.fuseMounts()
		if len(ms) == 1 {
			for _, d := range ms {
				if d != d2 {
					t.Fatalf("after the linger: FUSE mount of %s left, want %s", d, d2)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unused digest was not unmounted after the linger: %v", ms)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := n.unpublish(p4); err != nil {
		t.Fatal(err)
	}
	// Unpublishing twice is fine.
	if err := n.unpublish(p4); err != nil {
		t.Errorf("second unpublish: %v", err)
	}
}

// TestCSIKillPluginMidRead kills the node plugin with SIGKILL while a pod
// reads: the read completes, later reads work, and a restarted plugin
// re-attaches: it unpublishes the old pod and publishes new ones.
func TestCSIKillPluginMidRead(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	big := randBytes(31, 24<<20)
	buildTree(t, src, []node{fileNode("big.bin", 0o644, big), fileNode("small.txt", 0o644, []byte("small\n"))}, time.Time{})
	repo := reg.Host + "/vols/kill"
	d := push(t, repo, repo+":v1", src, smallChunks...)
	n := startCSI(t, 500*time.Millisecond)
	p := n.newPod("reader")
	n.mustPublish(p, repo+":v1", "")

	// The first pass reads while chunks come from the registry; the
	// plugin is killed a third of the way in. The second pass reads from
	// the cache, so a stall caused by the kill would stand out.
	path := filepath.Join(p.target, "big.bin")
	cold, coldBefore := readAcrossKill(t, path, big, n.kill9Node)
	n.startNode()
	control, _ := readAcrossKill(t, path, big, func() {})
	warm, warmBefore := readAcrossKill(t, path, big, n.kill9Node)
	t.Logf("MEASURE read stall when the plugin is killed -9: longest 128KiB read after the kill %v with chunks cached (before it %v; the same pass with no kill %v); %v while chunks are fetched (before it %v)",
		warm.Round(time.Microsecond), warmBefore.Round(time.Microsecond), control.Round(time.Microsecond), cold.Round(time.Microsecond), coldBefore.Round(time.Microsecond))
	// Later reads work with no plugin at all.
	compareTrees(t, src, p.target)

	// A restarted plugin re-attaches.
	n.startNode()
	p2 := n.newPod("second")
	n.mustPublish(p2, repo+"@"+d, "")
	compareTrees(t, src, p2.target)
	if ms := n.fuseMounts(); len(ms) != 1 {
		t.Fatalf("after the restart: FUSE mounts %v, want the one of %s", ms, d)
	}
	if err := n.unpublish(p); err != nil {
		t.Fatalf("unpublish after the restart: %v", err)
	}
	time.Sleep(time.Second) // past the linger: p2 still holds the digest
	compareTrees(t, src, p2.target)
	if err := n.unpublish(p2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(n.fuseMounts()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the digest stayed mounted after its last pod and the linger: %v", n.fuseMounts())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCSIAccessCheck: a pod whose credentials cannot read the manifest is
// refused with PermissionDenied although the digest is mounted and cached;
// no credential shows in the plugin's output or state.
func TestCSIAccessCheck(t *testing.T) {
	const user = "csi-user"
	pass := "pw-csi-" + strings.Repeat("7", 10)
	ip := net.IPv4(127, 0, 0, 1)
	reg := newAuthRegistry(t, ip, "htpasswd", user, pass)
	ca := []string{"--ca-file", reg.CA.File, "--tls"}
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	repo := reg.Host + "/vols/private"
	res := runWith(t, pass+"\n", nil, append(append([]string{"login"}, ca...), reg.Host, "-u", user, "--password-stdin")...)
	if res.code != 0 {
		t.Fatalf("login:\n%s", res)
	}
	res = runWith(t, "", nil, append(append(append([]string{"push"}, ca...), smallChunks...), repo+":v1", src)...)
	if res.code != 0 {
		t.Fatalf("push:\n%s", res)
	}
	os.Remove(filepath.Join(home(t), "config.json")) // the node has no credentials of its own

	n := startCSI(t, time.Minute, ca...)
	good := n.newPod("good")
	n.mustPublish(good, repo+":v1", dockerConfig(reg.Host, user, pass))
	compareTrees(t, src, good.target)

	for _, c := range []struct{ name, secret string }{
		{"wrong-password", dockerConfig(reg.Host, user, "wrong-"+pass)},
		{"no-secret", ""},
		{"other-registry", dockerConfig("registry.invalid", user, pass)},
	} {
		p := n.newPod(c.name)
		err := n.publish(p, repo+":v1", c.secret)
		if codeOf(err) != codes.PermissionDenied {
			t.Errorf("%s: NodePublishVolume = %v, want PermissionDenied", c.name, err)
		}
		if err != nil && !strings.Contains(err.Error(), reg.Host) {
			t.Errorf("%s: the error does not name the reference: %v", c.name, err)
		}
		if _, err := os.Stat(p.target); !os.IsNotExist(err) {
			t.Errorf("%s: the refused publish left %s: %v", c.name, p.target, err)
		}
	}
	compareTrees(t, src, good.target)
	// No secret in the logs or in the state directory.
	for what, s := range map[string]string{"node log": n.nodeLog.String(), "mounter log": n.mounterLog.String()} {
		if strings.Contains(s, pass) {
			t.Errorf("the %s shows the password", what)
		}
	}
	filepath.Walk(n.stateDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), pass) {
				t.Errorf("%s holds the password", p)
			}
		}
		return nil
	})
	if err := n.unpublish(good); err != nil {
		t.Fatal(err)
	}
}

// TestCSIErrors: bad references give the CSI codes and leave no mount.
func TestCSIErrors(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, []node{fileNode("a.txt", 0o644, []byte("a"))}, time.Time{})
	repo := reg.Host + "/vols/errs"
	d := push(t, repo, repo+":v1", src)
	notVolume := pushPlainImage(t, reg.Host+"/images/plain:v1")
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downHost := down.Addr().String()
	down.Close()

	n := startCSI(t, time.Minute)
	missingDigest := "sha256:" + strings.Repeat("ab", 32)
	cases := []struct {
		ref  string
		want codes.Code
	}{
		{"not a reference!", codes.InvalidArgument},
		{"oci:/var/lib/secret:v1", codes.InvalidArgument},
		{repo, codes.InvalidArgument}, // no tag or digest
		{repo + ":missing", codes.NotFound},
		{repo + "@" + missingDigest, codes.NotFound},
		{reg.Host + "/vols/nothing:v1", codes.NotFound},
		{notVolume, codes.InvalidArgument},
		{downHost + "/vols/errs:v1", codes.Unavailable},
	}
	for i, c := range cases {
		p := n.newPod("bad" + string(rune('a'+i)))
		err := n.publish(p, c.ref, "")
		if codeOf(err) != c.want {
			t.Errorf("ref %q: NodePublishVolume = %v, want %v", c.ref, err, c.want)
		}
		if err != nil && c.want != codes.InvalidArgument && !strings.Contains(err.Error(), strings.SplitN(c.ref, "@", 2)[0]) {
			t.Errorf("ref %q: the error does not name the reference: %v", c.ref, err)
		}
		if _, err := os.Stat(p.target); !os.IsNotExist(err) {
			t.Errorf("ref %q: the failed publish left the target: %v", c.ref, err)
		}
	}
	if ms := n.fuseMounts(); len(ms) != 0 {
		t.Errorf("failed publishes left FUSE mounts: %v", ms)
	}
	// Requests kubelet would never send, and the good one still works.
	p := n.newPod("ok")
	_, err = n.Node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: "v", TargetPath: p.target,
		VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}},
		VolumeContext:    map[string]string{"ref": repo + ":v1"}})
	if codeOf(err) != codes.InvalidArgument {
		t.Errorf("block access: %v, want InvalidArgument", err)
	}
	// A pre-provisioned volume: the handle is the reference.
	_, err = n.Node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: repo + "@" + d, TargetPath: p.target,
		VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY}},
		Readonly: true})
	if err != nil {
		t.Fatalf("publishing a volume handle: %v", err)
	}
	compareTrees(t, src, p.target)
	if _, err := n.Node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: repo + "@" + d, TargetPath: p.target}); err != nil {
		t.Fatal(err)
	}
}

// pushPlainImage pushes an ordinary container image (not a bdnvol volume)
// and returns its reference.
func pushPlainImage(t *testing.T, ref string) string {
	t.Helper()
	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

// readAcrossKill reads path in 128KiB reads, calling kill a third of the
// way in, checks the bytes against want and returns the longest read after
// the kill and before it.
func readAcrossKill(t *testing.T, path string, want []byte, kill func()) (after, before time.Duration) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 128<<10)
	got := make([]byte, 0, len(want))
	killed := false
	for {
		if !killed && len(got) >= len(want)/3 {
			kill()
			killed = true
		}
		start := time.Now()
		k, err := f.Read(buf)
		dt := time.Since(start)
		got = append(got, buf[:k]...)
		if killed && dt > after {
			after = dt
		} else if !killed && dt > before {
			before = dt
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read after %d bytes (plugin killed: %v): %v", len(got), killed, err)
		}
	}
	if string(got) != string(want) {
		t.Fatal("the read across the kill returned wrong bytes")
	}
	return after, before
}

// TestCSIConcurrentPublish: pods started together on a cold node share one
// mount, and reading together fetch every chunk once.
func TestCSIConcurrentPublish(t *testing.T) {
	reg := newDistribution(t)
	proxy := newFaultProxy(t, reg)
	repo := proxy.Host + "/vols/together"
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	push(t, repo, repo+":v1", src, smallChunks...)
	n := startCSI(t, time.Minute)
	proxy.Set(faultConfig{})

	pods := []pod{n.newPod("p1"), n.newPod("p2"), n.newPod("p3"), n.newPod("p4")}
	errs := make(chan error, len(pods))
	for _, p := range pods {
		go func() { errs <- n.publish(p, repo+":v1", "") }()
	}
	for range pods {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent NodePublishVolume: %v", err)
		}
	}
	if ms := n.fuseMounts(); len(ms) != 1 {
		t.Fatalf("four pods published together: FUSE mounts %v, want one", ms)
	}
	done := make(chan []byte, len(pods))
	for _, p := range pods {
		go func() {
			b, _ := os.ReadFile(filepath.Join(p.target, "big.bin"))
			done <- b
		}()
	}
	want := fileContents(t, filepath.Join(src, "big.bin"))
	for range pods {
		if string(<-done) != string(want) {
			t.Error("a pod read wrong bytes")
		}
	}
	for d, c := range proxy.blobGets() {
		if c != 1 {
			t.Errorf("blob %s fetched %d times by four pods reading together, want once", d, c)
		}
	}
	for _, p := range pods {
		if err := n.unpublish(p); err != nil {
			t.Fatal(err)
		}
	}
}
