package e2e

import (
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// mounterContainer returns the mounter's container in objs.
func mounterContainer(t *testing.T, objs []k8sObject) *corev1.Container {
	t.Helper()
	for _, o := range objs {
		if ds, ok := o.obj.(*appsv1.DaemonSet); ok && ds.Name == "bdnvol-csi-mounter" {
			return &ds.Spec.Template.Spec.Containers[0]
		}
	}
	t.Fatal("no DaemonSet bdnvol-csi-mounter")
	return nil
}

// expandArg expands $(VAR) in arg as kubelet does, from c's env: a value,
// or the pod's IP for a status.podIP field reference.
func expandArg(c *corev1.Container, arg, podIP string) string {
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
			v = podIP
		}
		arg = strings.ReplaceAll(arg, "$("+e.Name+")", v)
	}
	return arg
}

// TestKubernetesMounterMetricsAddr runs the real mounter with the
// manifests' --metrics-addr, expanded as kubelet does for a pod whose IP is
// 127.0.0.1 (the port made free): its metrics answer at the pod's IP and
// not at another address of the same host (127.0.0.2), which a mounter on
// the host network listening on every address (":9808") would answer on,
// all of the node's interfaces included.
func TestKubernetesMounterMetricsAddr(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("127.0.0.2 is a loopback address on Linux")
	}
	c := mounterContainer(t, loadManifests(t))
	addr := expandArg(c, flag(c, "metrics-addr"), "127.0.0.1")
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--metrics-addr=%s: %v", flag(c, "metrics-addr"), err)
	}
	addr = net.JoinHostPort(host, strconv.Itoa(freePort(t)))
	t.Logf("the manifests' --metrics-addr=%s runs as --metrics-addr=%s", flag(c, "metrics-addr"), addr)
	n := startCSIWith(t, time.Minute, "1GiB", []string{"--metrics-addr=" + addr})
	_, port, _ := net.SplitHostPort(addr)
	resp, err := http.Get("http://127.0.0.1:" + port + "/metrics")
	if err != nil {
		t.Fatalf("the metrics at the pod's IP: %v\n%s", err, n.mounterLog)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "bdnvol_") {
		t.Fatalf("the metrics at the pod's IP: %s\n%.300s", resp.Status, b)
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.2:"+port, 5*time.Second); err == nil {
		conn.Close()
		t.Errorf("the mounter's metrics answer on another address of the host (127.0.0.2:%s): --metrics-addr=%s listens on every address", port, flag(c, "metrics-addr"))
	}
}
