package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"sigs.k8s.io/yaml"
)

const (
	driverName  = "csi.bdnvol.dev"
	pluginDir   = kubeletDir + "/plugins/" + driverName
	testLinger  = 5 * time.Second // the node plugin's --linger in the cluster tests
	nodeDSName  = "bdnvol-csi-node"
	registrarCt = "node-driver-registrar"
)

var bdnvolImageRE = regexp.MustCompile(`\S*bdnvol/bdnvol@sha256:[0-9a-f]{64}`)

// renderDeploy returns deploy/kubernetes as applied in the cluster tests:
// the bdnvol image made local (imported, not pulled), the DaemonSets on the
// host's network (the test's registry listens on the host's loopback, and
// the cluster has no pod network), the node plugin's linger shortened and
// pods' warm state published (--warmstate-publish), and
// node-driver-registrar, which this machine cannot pull, left out:
// testRegistrar does its work. With caFile, the node plugin and the mounter
// trust that CA (a hostPath volume and --ca-file), as an operator whose
// registry has a private CA sets them up.
func renderDeploy(t *testing.T, caFile string, apiPort int) string {
	t.Helper()
	files, err := filepath.Glob("../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	var docs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			doc = bdnvolImageRE.ReplaceAllString(doc, imgBdnvol)
			if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
				continue
			}
			if regexp.MustCompile(`(?m)^kind: DaemonSet\s*$`).MatchString(doc) {
				doc = renderDaemonSet(t, doc, caFile, apiPort)
			}
			docs = append(docs, doc)
		}
	}
	return strings.Join(docs, "\n---\n")
}

func renderDaemonSet(t *testing.T, doc, caFile string, apiPort int) string {
	t.Helper()
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(doc), &ds); err != nil {
		t.Fatalf("DaemonSet: %v", err)
	}
	spec := &ds.Spec.Template.Spec
	spec.HostNetwork = true
	spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
	// The test cluster runs no kube-proxy: the kubernetes Service's address
	// that kubelet gives pods leads nowhere, so the mounter (the peer tier's
	// membership and CA) reaches the API server where it listens.
	for i := range spec.Containers {
		if ct := &spec.Containers[i]; slices.Contains(ct.Args, "mounter") {
			ct.Env = append(ct.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"},
				corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: strconv.Itoa(apiPort)})
		}
	}
	if caFile != "" {
		dir := corev1.HostPathDirectory
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "e2e-ca", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: filepath.Dir(caFile), Type: &dir}}})
		for i := range spec.Containers {
			ct := &spec.Containers[i]
			if ct.Name == registrarCt || slices.Contains(ct.Args, "fd-holder") {
				continue // no registry calls
			}
			ct.VolumeMounts = append(ct.VolumeMounts, corev1.VolumeMount{Name: "e2e-ca", MountPath: "/e2e-ca", ReadOnly: true})
			ct.Args = append(ct.Args, "--ca-file=/e2e-ca/"+filepath.Base(caFile))
		}
	}
	if ds.Name != nodeDSName {
		b, err := yaml.Marshal(&ds)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var keep = spec.Containers[:0]
	lingerSet := false
	for _, ct := range spec.Containers {
		if ct.Name == registrarCt {
			continue
		}
		for i, a := range ct.Args {
			if strings.HasPrefix(a, "--linger=") {
				ct.Args[i] = "--linger=" + testLinger.String()
				lingerSet = true
			}
		}
		// Signature keys from a ConfigMap, named by requireSignature; pods'
		// warm state published at unpublish when they ask (WarmState).
		ct.Args = append(ct.Args, "--key-dir=/etc/bdnvol/keys", "--warmstate-publish")
		ct.VolumeMounts = append(ct.VolumeMounts, corev1.VolumeMount{Name: "signature-keys", MountPath: "/etc/bdnvol/keys", ReadOnly: true})
		keep = append(keep, ct)
	}
	if !lingerSet {
		t.Fatal("the node plugin in node.yaml has no --linger to shorten")
	}
	spec.Containers = keep
	optional := true
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "signature-keys", VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "bdnvol-e2e-keys"}, Optional: &optional}}})
	b, err := yaml.Marshal(&ds)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// testRegistrar registers the node plugin with kubelet, as
// node-driver-registrar does: kubelet finds its socket in plugins_registry,
// asks GetInfo for the plugin's endpoint and reports back.
type testRegistrar struct {
	registerapi.UnimplementedRegistrationServer
	mu     sync.Mutex
	status []string
}

func (r *testRegistrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: driverName,
		Endpoint: pluginDir + "/csi.sock", SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *testRegistrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.mu.Lock()
	r.status = append(r.status, fmt.Sprintf("registered=%v error=%q", s.PluginRegistered, s.Error))
	r.mu.Unlock()
	return &registerapi.RegistrationStatusResponse{}, nil
}

// register serves the registration socket once the plugin's socket is up,
// and waits until kubelet lists the driver in the node's CSINode.
func (c *cluster) register(t *testing.T) {
	t.Helper()
	c.waitFor("the node plugin's socket "+pluginDir+"/csi.sock", func() (bool, string) {
		conn, err := net.Dial("unix", pluginDir+"/csi.sock")
		if err == nil {
			conn.Close()
		}
		return err == nil, fmt.Sprint(err)
	})
	sock := kubeletDir + "/plugins_registry/" + driverName + "-reg.sock"
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	r := &testRegistrar{}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Stop(); os.Remove(sock) })
	c.waitFor("CSINode localhost to list "+driverName, func() (bool, string) {
		out, err := c.kubectlErr("get", "csinode", "localhost", "-o", "jsonpath={.spec.drivers[*].name}")
		r.mu.Lock()
		defer r.mu.Unlock()
		return err == nil && strings.Contains(out, driverName), out + fmt.Sprintf(" %v %v", err, r.status)
	})
}

// readerPod is a pod, running as nobody on the host's network, that mounts
// ref read-only at /data, runs script and then sleeps.
func readerPod(name, ref, script string) string {
	return readerPodWith(name, script, fmt.Sprintf(`csi:
        driver: %s
        readOnly: true
        volumeAttributes:
          ref: %s`, driverName, jsonString(ref)))
}

// readerPodWith is readerPod with the data volume's source given as YAML
// (indented for its place under "- name: data").
func readerPodWith(name, script, volume string) string {
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
    - name: reader
      image: %s
      imagePullPolicy: Never
      command: ["sh", "-c", %s]
      volumeMounts:
        - {name: data, mountPath: /data, readOnly: true}
  volumes:
    - name: data
      %s
`, name, imgBusybox, jsonString(script+"; echo READY; exec sleep 3600"), volume)
}

// readScript prints what the checks compare: the files, the uid, and what
// a write into the volume gives.
const readScript = `cat /data/a.txt; sha256sum /data/sub/b.bin; echo uid=$(id -u); if touch /data/new 2>/tmp/err; then echo WRITE-SUCCEEDED; else cat /tmp/err; fi`

// TestCluster runs bdnvol's deploy/kubernetes on a real single-node cluster
// (kubelet, containerd, the API server): the DaemonSets come up, kubelet
// registers the driver, non-root pods read a version read-only through
// inline volumes sharing one FUSE mount, a missing tag reaches the pod's
// events, and after the node plugin pod is replaced and the linger expires,
// a new pod still gets its volume.
func TestCluster(t *testing.T) {
	requireCluster(t)
	start := time.Now()
	builds := startImageBuilds(t, t.TempDir())
	c := startCluster(t)
	t.Logf("cluster up in %v", time.Since(start).Round(time.Second))

	reg := newDistribution(t)
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	text := "hello from bdnvol on kubernetes\n"
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>9)
	}
	os.WriteFile(filepath.Join(src, "a.txt"), []byte(text), 0o644)
	os.WriteFile(filepath.Join(src, "sub", "b.bin"), big, 0o644)
	ref := reg.Host + "/team/vol:v1"
	mustRun(t, "push", ref, src)
	bigSum := fmt.Sprintf("%x", sha256.Sum256(big))

	// A private registry (htpasswd over TLS with its own CA), whose CA the
	// node plugin and the mounter are given. It listens on the host's
	// address, not loopback, where bdnvol speaks plain HTTP.
	var priv *authRegistry
	var privRef, caFile string
	privText := "tenant a's weights\n"
	if ip := serverIP(t); ip != nil {
		priv = newAuthRegistry(t, ip, "htpasswd", "alice", "alice-pw")
		privRef, caFile = priv.Host+"/tenant-a/weights:v1", priv.CA.File
		privSrc := t.TempDir()
		os.WriteFile(filepath.Join(privSrc, "secret.txt"), []byte(privText), 0o644)
		if r := runWith(t, "alice-pw\n", nil, "login", "--ca-file", caFile, priv.Host, "-u", "alice", "--password-stdin"); r.code != 0 {
			t.Fatalf("login to the private registry:\n%s", r)
		}
		if r := runWith(t, "", nil, "push", "--ca-file", caFile, privRef, privSrc); r.code != 0 {
			t.Fatalf("push to the private registry:\n%s", r)
		}
	}

	// A cosign key pair; the public key goes to the node plugin in a
	// ConfigMap mounted at its --key-dir.
	signKey, signPub := keyPair(t, t.TempDir(), "release")
	c.kubectl("create", "configmap", "bdnvol-e2e-keys", "-n", "kube-system", "--from-file=release.pub="+signPub)

	c.importImages(builds)
	t.Logf("images imported at %v", time.Since(start).Round(time.Second))
	c.apply(renderDeploy(t, caFile, c.apiPort))
	for _, ds := range []string{"bdnvol-csi-fdholder", "bdnvol-csi-node", "bdnvol-csi-mounter"} {
		c.waitFor("DaemonSet "+ds+" to be ready", func() (bool, string) {
			out, err := c.kubectlErr("get", "daemonset", "-n", "kube-system", ds, "-o", "jsonpath={.status.desiredNumberScheduled} {.status.numberReady}")
			return err == nil && out == "1 1", out
		})
	}
	c.register(t)
	t.Logf("driver registered at %v", time.Since(start).Round(time.Second))

	checkReader := func(t *testing.T, pod string) {
		t.Helper()
		c.waitFor("pod "+pod+" to print READY", func() (bool, string) {
			l := c.podLogs("default", pod)
			return strings.Contains(l, "READY"), l
		})
		l := c.podLogs("default", pod)
		for _, want := range []string{text, bigSum + "  /data/sub/b.bin", "uid=65534", "Read-only file system"} {
			if !strings.Contains(l, want) {
				t.Errorf("pod %s's output lacks %q:\n%s", pod, want, l)
			}
		}
		if strings.Contains(l, "WRITE-SUCCEEDED") {
			t.Errorf("pod %s wrote into its read-only volume:\n%s", pod, l)
		}
	}
	timeToRun := func(pod string) time.Duration {
		t0 := time.Now()
		c.apply(readerPod(pod, ref, readScript))
		c.waitRunning("default", pod)
		return time.Since(t0)
	}

	if !t.Run("ReadOnlyNonRoot", func(t *testing.T) {
		blobs := func() int { return reg.Stats().Requests["GET blob"] }
		b0 := blobs()
		cold := timeToRun("reader-a")
		checkReader(t, "reader-a")
		b1 := blobs()
		warm := timeToRun("reader-b")
		checkReader(t, "reader-b")
		t.Logf("pod creation -> Running with a bdnvol volume: cold %v, version already mounted %v",
			cold.Round(100*time.Millisecond), warm.Round(100*time.Millisecond))
		t.Logf("registry blob GETs: %d for the first pod (its reads), %d more for the second", b1-b0, blobs()-b1)
		if n := blobs() - b1; n != 0 {
			t.Errorf("the second pod of a mounted version fetched %d blobs", n)
		}
		if devs := fuseDevices(kubeletDir); len(devs) != 1 {
			t.Errorf("two pods of one version: %d FUSE file systems under %s, want 1: %v", len(devs), kubeletDir, devs)
		}
	}) {
		return
	}

	t.Run("Peers", func(t *testing.T) { testClusterPeers(t, c, reg) })
	t.Run("WarmState", func(t *testing.T) { testClusterWarmState(t, c, reg) })

	t.Run("MissingTag", func(t *testing.T) {
		c.apply(readerPod("missing-tag", reg.Host+"/team/vol:nope", "true"))
		c.waitFor("a NotFound event on pod missing-tag", func() (bool, string) {
			ev := c.events("default", "missing-tag")
			return strings.Contains(ev, "NotFound"), ev
		})
		if ph := c.podPhase("default", "missing-tag"); ph != "Pending" {
			t.Errorf("pod with a missing tag is %q, want Pending", ph)
		}
		c.kubectl("delete", "pod", "missing-tag", "--wait=false")
	})

	t.Run("BadReference", func(t *testing.T) {
		c.apply(readerPod("bad-ref", "Not//A Reference!", "true"))
		c.waitFor("an InvalidArgument event on pod bad-ref", func() (bool, string) {
			ev := c.events("default", "bad-ref")
			return strings.Contains(ev, "InvalidArgument"), ev
		})
		c.kubectl("delete", "pod", "bad-ref", "--wait=false")
	})

	// A pod with the registry's credentials in a nodePublishSecretRef reads
	// the private version; a pod on the same node without them is refused,
	// although the version is mounted and its chunks are in the node's cache.
	t.Run("PrivateRegistrySecret", func(t *testing.T) {
		if priv == nil {
			t.Skip("this machine has no address but loopback for a TLS registry")
		}
		auth := base64.StdEncoding.EncodeToString([]byte("alice:alice-pw"))
		cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, priv.Host, auth)
		c.apply(fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: tenant-a-registry, namespace: default}
type: kubernetes.io/dockerconfigjson
data:
  .dockerconfigjson: %s
`, base64.StdEncoding.EncodeToString([]byte(cfg))))
		vol := func(secret bool) string {
			v := fmt.Sprintf("csi:\n        driver: %s\n        readOnly: true\n        volumeAttributes:\n          ref: %s", driverName, jsonString(privRef))
			if secret {
				v += "\n        nodePublishSecretRef: {name: tenant-a-registry}"
			}
			return v
		}
		c.apply(readerPodWith("tenant-a", "cat /data/secret.txt", vol(true)))
		c.waitFor("pod tenant-a to print READY", func() (bool, string) {
			l := c.podLogs("default", "tenant-a")
			return strings.Contains(l, "READY"), l + c.events("default", "tenant-a")
		})
		if l := c.podLogs("default", "tenant-a"); !strings.Contains(l, privText) {
			t.Errorf("pod tenant-a with the secret did not read the file:\n%s", l)
		}
		before := priv.Stats().Requests["GET blob"]
		c.apply(readerPodWith("tenant-b", "cat /data/secret.txt", vol(false)))
		c.waitFor("a refusal event on pod tenant-b", func() (bool, string) {
			ev := c.events("default", "tenant-b")
			return strings.Contains(ev, "PermissionDenied") || strings.Contains(ev, "Unauthenticated"), ev
		})
		if ph := c.podPhase("default", "tenant-b"); ph != "Pending" {
			t.Errorf("pod tenant-b without the secret is %q, want Pending", ph)
		}
		if l := c.podLogs("default", "tenant-b"); strings.Contains(l, privText) {
			t.Errorf("pod tenant-b without the secret read tenant a's file:\n%s", l)
		}
		if n := priv.Stats().Requests["GET blob"] - before; n != 0 {
			t.Errorf("the refused pod's attempts fetched %d blobs", n)
		}
		c.kubectl("delete", "pod", "tenant-a", "tenant-b", "--wait=false")
	})

	// A tag moved between two pods' starts: each keeps the version it
	// started with.
	t.Run("TagMovedBetweenPods", func(t *testing.T) {
		mref := reg.Host + "/team/moving:prod"
		for i, pod := range []string{"moving-1", "moving-2"} {
			src := t.TempDir()
			os.WriteFile(filepath.Join(src, "which.txt"), []byte(fmt.Sprintf("version %d\n", i+1)), 0o644)
			mustRun(t, "push", mref, src)
			c.apply(readerPod(pod, mref, "cat /data/which.txt"))
			c.waitFor("pod "+pod+" to print READY", func() (bool, string) {
				l := c.podLogs("default", pod)
				return strings.Contains(l, "READY"), l + c.events("default", pod)
			})
		}
		for i, pod := range []string{"moving-1", "moving-2"} {
			want := fmt.Sprintf("version %d\n", i+1)
			if out, err := c.kubectlErr("exec", pod, "--", "cat", "/data/which.txt"); err != nil || out != want {
				t.Errorf("pod %s reads %q (%v), want %q", pod, out, err, want)
			}
		}
		c.kubectl("delete", "pod", "moving-1", "moving-2", "--wait=false")
	})

	// A pre-provisioned PersistentVolume and its claim, read by a pod.
	t.Run("PersistentVolume", func(t *testing.T) {
		c.apply(fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata: {name: weights-pv}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadOnlyMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  csi:
    driver: %s
    volumeHandle: weights-pv
    readOnly: true
    volumeAttributes: {ref: %s}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: weights, namespace: default}
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  volumeName: weights-pv
  resources: {requests: {storage: 1Gi}}
`, driverName, jsonString(ref)))
		c.apply(readerPodWith("pv-reader", readScript, "persistentVolumeClaim: {claimName: weights, readOnly: true}"))
		checkReader(t, "pv-reader")
		c.kubectl("delete", "pod", "pv-reader", "--wait=false")
	})

	// requireSignature naming a key of the ConfigMap: a signed version's pod
	// reads, an unsigned version's pod never starts.
	t.Run("RequireSignature", func(t *testing.T) {
		signedRef, unsignedRef := reg.Host+"/team/signed:v1", reg.Host+"/team/unsigned:v1"
		mustRun(t, "push", signedRef, src)
		mustRun(t, "push", unsignedRef, src)
		if r := signRun(t, "sign", "--key", signKey, signedRef); r.code != 0 {
			t.Fatalf("sign:\n%s", r)
		}
		vol := func(ref string) string {
			return fmt.Sprintf("csi:\n        driver: %s\n        readOnly: true\n        volumeAttributes:\n          ref: %s\n          requireSignature: release.pub",
				driverName, jsonString(ref))
		}
		c.apply(readerPodWith("signed-reader", readScript, vol(signedRef)))
		checkReader(t, "signed-reader")
		c.apply(readerPodWith("unsigned-reader", readScript, vol(unsignedRef)))
		c.waitFor("a PermissionDenied event on pod unsigned-reader", func() (bool, string) {
			ev := c.events("default", "unsigned-reader")
			return strings.Contains(ev, "PermissionDenied"), ev
		})
		if ph := c.podPhase("default", "unsigned-reader"); ph != "Pending" {
			t.Errorf("the unsigned version's pod is %q, want Pending", ph)
		}
		c.kubectl("delete", "pod", "signed-reader", "unsigned-reader", "--wait=false")
	})

	// kubelet restarted under running pods: they go on reading, and kubelet
	// (re-registering the driver from plugins_registry) publishes for a new
	// pod.
	t.Run("KubeletRestart", func(t *testing.T) {
		var kl *clusterProc
		for _, p := range c.procs {
			if p.name == "kubelet" && p.running() {
				kl = p
			}
		}
		if kl == nil {
			t.Fatal("no running kubelet")
		}
		kl.stop(10 * time.Second)
		procs := c.procs[:0] // the cluster's health checks watch the others
		for _, p := range c.procs {
			if p != kl {
				procs = append(procs, p)
			}
		}
		c.procs = procs
		if len(fuseDevices(kubeletDir)) == 0 {
			t.Errorf("the FUSE mounts went with kubelet")
		}
		c.startKubelet()
		c.waitFor("node localhost to be Ready again", func() (bool, string) {
			out, err := c.kubectlErr("get", "node", "localhost", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			return err == nil && out == "True", out
		})
		c.waitFor("reader-a to read through kubelet's restart", func() (bool, string) {
			out, err := c.kubectlErr("exec", "reader-a", "--", "cat", "/data/a.txt")
			return err == nil && out == text, fmt.Sprint(out, err)
		})
		c.apply(readerPod("after-kubelet", ref, readScript))
		checkReader(t, "after-kubelet")
		c.kubectl("delete", "pod", "after-kubelet", "--wait=false")
	})

	// The node plugin pod is replaced while reader-a reads; once the readers
	// are gone and the linger has expired, the version is unmounted, and a
	// pod created after that must get it mounted again.
	t.Run("NewPodAfterNodePluginRestart", func(t *testing.T) {
		old := strings.TrimSpace(c.kubectl("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/component=node", "-o", "name"))
		c.kubectl("delete", "-n", "kube-system", old)
		c.waitFor("a new node plugin pod to run", func() (bool, string) {
			out, err := c.kubectlErr("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/component=node",
				"-o", `jsonpath={range .items[*]}pod/{.metadata.name} {.status.phase} {.status.containerStatuses[*].ready}{"\n"}{end}`)
			f := strings.Fields(out)
			return err == nil && len(f) == 3 && f[0] != old && f[1] == "Running" && f[2] == "true", out
		})
		if out, err := c.kubectlErr("exec", "reader-a", "--", "cat", "/data/a.txt"); err != nil || out != text {
			t.Errorf("reader-a after the node plugin restart: %q, %v", out, err)
		}
		c.kubectl("delete", "pod", "reader-a", "reader-b", "--wait=false")
		c.waitGone("pod", "reader-a", "reader-b")
		c.waitForIn(time.Minute, "the version to be unmounted after the linger", func() (bool, string) {
			devs := fuseDevices(kubeletDir)
			return len(devs) == 0, fmt.Sprint(devs)
		})
		time.Sleep(testLinger) // the mounter's unmount, after the host's mount went
		// Before the fix it never ran: the mounter's unmount waited for ever
		// on a private copy of the FUSE mount in the new node plugin
		// container, and the node plugin's lock with it.
		t0 := time.Now()
		c.apply(readerPod("reader-c", ref, readScript))
		c.waitForIn(90*time.Second, "pod reader-c, created after the node plugin restart and the linger, to run", func() (bool, string) {
			out, err := c.kubectlErr("get", "pod", "reader-c", "-o", `jsonpath={.status.phase} {.status.containerStatuses[*].ready}`)
			return err == nil && out == "Running true", out + " " + c.events("default", "reader-c")
		})
		d := time.Since(t0)
		b := reg.Stats().Requests["GET blob"]
		checkReader(t, "reader-c")
		t.Logf("registry blob GETs for the third pod's reads, after a new mount over the node's cache: %d", reg.Stats().Requests["GET blob"]-b)
		t.Logf("pod creation -> Running after the node plugin restart and the linger: %v", d.Round(100*time.Millisecond))
	})
	// The mounter DaemonSet rolled (kubectl rollout restart) under a pod
	// streaming a 128 MiB file through one open descriptor, 1 MiB at a time
	// with a pause between reads: the old mounter leaves its mounts to the
	// fd holder, the new one takes them over, and no read fails; the bytes
	// hash to the file's, and the kernel mount is the same one throughout.
	t.Run("MounterRollingUpdate", func(t *testing.T) {
		const mib, reads = 1 << 20, 128
		rsrc := t.TempDir()
		rbig := make([]byte, reads*mib)
		rand.NewChaCha8([32]byte{27}).Read(rbig)
		if err := os.WriteFile(filepath.Join(rsrc, "big.bin"), rbig, 0o644); err != nil {
			t.Fatal(err)
		}
		rref := reg.Host + "/team/rolling:v1"
		mustRun(t, "push", rref, rsrc)
		wantSum := fmt.Sprintf("%x", sha256.Sum256(rbig))
		rbig = nil
		// Each read is one dd of 1 MiB on the shared descriptor 3; its time
		// is taken from /proc/uptime (10 ms steps: busybox's date has no
		// nanoseconds), and the longest is printed.
		script := fmt.Sprintf(`exec 3</data/big.bin || { echo OPEN-FAILED; exit 1; }
now() { read up rest </proc/uptime; echo $(( ${up%%.*}${up#*.} * 10 )); }
{ i=0; max=0
  while [ $i -lt %d ]; do
    t0=$(now)
    if ! dd bs=%d count=1 iflag=fullblock <&3 2>/tmp/dd.err; then echo "READ-FAILED at MiB $i: $(cat /tmp/dd.err)" >&2; break; fi
    t1=$(now); d=$(( t1 - t0 )); if [ $d -gt $max ]; then max=$d; fi
    i=$((i + 1)); if [ $i -eq 8 ]; then echo STREAMING >&2; fi
    sleep 0.25
  done
  echo "STREAMED reads=$i longest_ms=$max" >&2
} | sha256sum >/tmp/sum; echo "SUM $(cat /tmp/sum)"`, reads, mib)
		c.apply(readerPod("streamer", rref, script))
		c.waitForIn(2*time.Minute, "pod streamer to start streaming", func() (bool, string) {
			l := c.podLogs("default", "streamer")
			return strings.Contains(l, "STREAMING") || strings.Contains(l, "FAILED"), l + c.events("default", "streamer")
		})
		devsBefore := fuseDevices(kubeletDir)
		mounterPods := func() string {
			out, _ := c.kubectlErr("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/component=mounter",
				"-o", `jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}`)
			return strings.TrimSpace(out)
		}
		holderPods := func() string {
			out, _ := c.kubectlErr("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/component=fdholder", "-o", "name")
			return strings.TrimSpace(out)
		}
		oldMounter, oldHolder := mounterPods(), holderPods()
		t0 := time.Now()
		c.kubectl("rollout", "restart", "-n", "kube-system", "daemonset/bdnvol-csi-mounter")
		if out, err := c.kubectlErr("rollout", "status", "-n", "kube-system", "daemonset/bdnvol-csi-mounter", "--timeout=3m"); err != nil {
			t.Fatalf("rollout status: %v\n%s\nmounter pods: %s", err, out, mounterPods())
		}
		rollout := time.Since(t0)
		newMounter := mounterPods()
		if newMounter == oldMounter || strings.Contains(newMounter, "\n") {
			t.Errorf("running mounter pods before the rollout %q, after %q: want one new pod", oldMounter, newMounter)
		}
		if h := holderPods(); h != oldHolder {
			t.Errorf("the fd holder pod changed with the mounter's rollout: %q, then %q", oldHolder, h)
		}
		if l := c.podLogs("default", "streamer"); strings.Contains(l, "STREAMED") {
			t.Errorf("the stream ended before the rollout did, so it did not span it:\n%s", l)
		}
		c.waitForIn(3*time.Minute, "pod streamer to finish streaming", func() (bool, string) {
			l := c.podLogs("default", "streamer")
			return strings.Contains(l, "READY"), l
		})
		l := c.podLogs("default", "streamer")
		if strings.Contains(l, "FAILED") || !strings.Contains(l, fmt.Sprintf("STREAMED reads=%d ", reads)) {
			t.Errorf("a read failed across the mounter's rollout:\n%s", l)
		}
		if !strings.Contains(l, "SUM "+wantSum+"  -") {
			t.Errorf("the streamed bytes do not hash to the file's %s:\n%s", wantSum, l)
		}
		longest := regexp.MustCompile(`longest_ms=(\d+)`).FindStringSubmatch(l)
		if longest == nil {
			t.Errorf("no longest read in the streamer's output:\n%s", l)
			longest = []string{"", "?"}
		}
		for d := range devsBefore {
			if !fuseDevices(kubeletDir)[d] {
				t.Errorf("FUSE file system %s under %s went with the rollout (before %v, after %v)", d, kubeletDir, devsBefore, fuseDevices(kubeletDir))
			}
		}
		t.Logf("mounter rollout (rollout restart -> rollout status done) under a streaming pod: %v; longest 1 MiB read of the stream: %s ms",
			rollout.Round(100*time.Millisecond), longest[1])
		// A pod started after the rollout gets its volume from the new mounter.
		c.apply(readerPod("after-rollout", ref, readScript))
		checkReader(t, "after-rollout")
		c.kubectl("delete", "pod", "streamer", "after-rollout", "--wait=false")
	})
	// The warm list ConfigMap edited: the mounter warms the version (its
	// metric says so), and a pod started after that fetches no blob.
	t.Run("WarmListConfigMap", func(t *testing.T) {
		wsrc := t.TempDir()
		wbig := make([]byte, 2<<20)
		for i := range wbig {
			wbig[i] = byte(i*13 + i>>11)
		}
		os.WriteFile(filepath.Join(wsrc, "warm.bin"), wbig, 0o644)
		wref := reg.Host + "/team/warm:v1"
		mustRun(t, "push", wref, wsrc)
		c.apply(fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata: {name: bdnvol-csi-warm-list, namespace: kube-system, labels: {app.kubernetes.io/name: bdnvol-csi}}
data:
  warm-list: |
    %s
`, wref))
		// The metrics listen on the mounter pod's IP (on the host network
		// here: the node's address), not on every address.
		podIP := strings.TrimSpace(c.kubectl("get", "pod", "-n", "kube-system", "-l", "app.kubernetes.io/component=mounter",
			"-o", "jsonpath={.items[0].status.podIP}"))
		metricsURL := "http://" + net.JoinHostPort(podIP, "9808") + "/metrics"
		c.waitForIn(2*time.Minute, "the mounter to report the warm list entry warm", func() (bool, string) {
			resp, err := http.Get(metricsURL)
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, `bdnvol_warm_entries{state="warm"}`) {
					return strings.HasSuffix(l, " 1"), l
				}
			}
			return false, "no bdnvol_warm_entries{state=\"warm\"}"
		})
		before := reg.Stats().Requests["GET blob"]
		c.apply(readerPod("warm-reader", wref, "sha256sum /data/warm.bin"))
		c.waitFor("pod warm-reader to print READY", func() (bool, string) {
			l := c.podLogs("default", "warm-reader")
			return strings.Contains(l, "READY"), l + c.events("default", "warm-reader")
		})
		if l, want := c.podLogs("default", "warm-reader"), fmt.Sprintf("%x", sha256.Sum256(wbig)); !strings.Contains(l, want) {
			t.Errorf("warm-reader read other bytes:\n%s", l)
		}
		if n := reg.Stats().Requests["GET blob"] - before; n != 0 {
			t.Errorf("a pod of a warm version fetched %d blobs from the registry", n)
		}
	})

	// A node reboot, simulated: kubelet, every container and containerd are
	// killed and every mount under the kubelet directory goes, as at a
	// power cut; the control plane stays. Once containerd and kubelet start
	// again, the DaemonSets come back and a pod that always restarts gets its
	// volume again.
	t.Run("NodeReboot", func(t *testing.T) {
		c.apply(strings.Replace(readerPod("survivor", ref, "cat /data/a.txt"), "restartPolicy: Never", "restartPolicy: Always", 1))
		c.waitFor("pod survivor to print READY", func() (bool, string) {
			l := c.podLogs("default", "survivor")
			return strings.Contains(l, "READY"), l + c.events("default", "survivor")
		})
		var keep []*clusterProc
		var kl, cd *clusterProc
		for _, p := range c.procs {
			switch {
			case p.name == "kubelet" && p.running():
				kl = p
			case p.name == "containerd" && p.running():
				cd = p
			case p.running():
				keep = append(keep, p)
			}
		}
		if kl == nil || cd == nil {
			t.Fatal("no running kubelet or containerd")
		}
		c.procs = keep
		syscall.Kill(-kl.cmd.Process.Pid, syscall.SIGKILL)
		<-kl.done
		c.killTasks()
		syscall.Kill(-cd.cmd.Process.Pid, syscall.SIGKILL)
		<-cd.done
		c.killShims()
		unmountUnder(kubeletDir + "/")
		if devs := fuseDevices(kubeletDir); len(devs) != 0 {
			t.Fatalf("FUSE mounts left after the simulated power cut: %v", devs)
		}
		t0 := time.Now()
		c.startContainerd()
		c.startKubelet()
		c.waitForIn(3*time.Minute, "pod survivor to read its volume again after the reboot", func() (bool, string) {
			out, err := c.kubectlErr("exec", "survivor", "--", "cat", "/data/a.txt")
			return err == nil && out == text, fmt.Sprint(out, err, " ", c.events("default", "survivor"))
		})
		t.Logf("node reboot (containerd and kubelet started) -> the pod reads its volume again: %v", time.Since(t0).Round(100*time.Millisecond))
		c.kubectl("delete", "pod", "survivor", "--wait=false")
	})

	// Uninstall: with the pods and the driver's objects deleted, no FUSE
	// mount and no bind of one is left on the host.
	t.Run("UninstallLeavesNoMount", func(t *testing.T) {
		c.kubectl("delete", "pods", "--all", "-n", "default", "--wait=false")
		c.waitFor("the test pods to be gone", func() (bool, string) {
			out, err := c.kubectlErr("get", "pods", "-n", "default", "-o", "name")
			return err == nil && strings.TrimSpace(out) == "", out
		})
		if _, err := c.kubectlIn(renderDeploy(t, caFile, c.apiPort), "delete", "-f", "-", "--wait=true"); err != nil {
			t.Fatalf("deleting the driver: %v", err)
		}
		c.waitFor("the driver's pods to be gone", func() (bool, string) {
			out, err := c.kubectlErr("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=bdnvol-csi", "-o", "name")
			return err == nil && strings.TrimSpace(out) == "", out
		})
		c.waitForIn(time.Minute, "no FUSE mount under "+kubeletDir, func() (bool, string) {
			devs := fuseDevices(kubeletDir)
			return len(devs) == 0, fmt.Sprint(devs)
		})
	})
	t.Logf("TestCluster took %v", time.Since(start).Round(time.Second))
}
