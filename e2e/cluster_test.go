package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
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
// the cluster has no pod network), the node plugin's linger shortened, and
// node-driver-registrar, which this machine cannot pull, left out:
// testRegistrar does its work.
func renderDeploy(t *testing.T) string {
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
				doc = renderDaemonSet(t, doc)
			}
			docs = append(docs, doc)
		}
	}
	return strings.Join(docs, "\n---\n")
}

func renderDaemonSet(t *testing.T, doc string) string {
	t.Helper()
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(doc), &ds); err != nil {
		t.Fatalf("DaemonSet: %v", err)
	}
	spec := &ds.Spec.Template.Spec
	spec.HostNetwork = true
	spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
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
		keep = append(keep, ct)
	}
	if !lingerSet {
		t.Fatal("the node plugin in node.yaml has no --linger to shorten")
	}
	spec.Containers = keep
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
      csi:
        driver: %s
        readOnly: true
        volumeAttributes:
          ref: %s
`, name, imgBusybox, jsonString(script+"; echo READY; exec sleep 3600"), driverName, jsonString(ref))
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

	c.importImages(builds)
	t.Logf("images imported at %v", time.Since(start).Round(time.Second))
	c.apply(renderDeploy(t))
	for _, ds := range []string{"bdnvol-csi-node", "bdnvol-csi-mounter"} {
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
		cold := timeToRun("reader-a")
		checkReader(t, "reader-a")
		warm := timeToRun("reader-b")
		checkReader(t, "reader-b")
		t.Logf("pod creation -> Running with a bdnvol volume: cold %v, version already mounted %v",
			cold.Round(100*time.Millisecond), warm.Round(100*time.Millisecond))
		if devs := fuseDevices(kubeletDir); len(devs) != 1 {
			t.Errorf("two pods of one version: %d FUSE file systems under %s, want 1: %v", len(devs), kubeletDir, devs)
		}
	}) {
		return
	}

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
		checkReader(t, "reader-c")
		t.Logf("pod creation -> Running after the node plugin restart and the linger: %v", d.Round(100*time.Millisecond))
	})
	t.Logf("TestCluster took %v", time.Since(start).Round(time.Second))
}
