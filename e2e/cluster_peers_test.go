package e2e

import (
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
)

// testClusterPeers runs the peer tier as deploy/kubernetes sets it up, on
// the cluster's node and on two more nodes (a real mounter and node plugin
// each, run beside the cluster, with their own caches and addresses and the
// mounter's service account token), whose endpoints the test adds to the
// peers Service as the EndpointSlice controller would for mounter pods of
// other nodes. It checks, through the API server only:
//   - the cluster's mounter filled the empty CA Secret (its account's Role
//     allows get and update of it) and the other nodes use that CA;
//   - every mounter's membership is the Service's three endpoints;
//   - three nodes reading one version at once (a pod on the cluster's node,
//     publishes on the others), their mounts open, read every byte right
//     while every chunk leaves the registry once.
func testClusterPeers(t *testing.T, c *cluster, reg *registry) {
	c.waitFor("the mounter to write a CA into the empty Secret bdnvol-csi-peer-ca", func() (bool, string) {
		out, err := c.kubectlErr("get", "secret", "-n", "kube-system", "bdnvol-csi-peer-ca", "-o", `jsonpath={.data.ca\.crt}`)
		return err == nil && len(out) > 100, fmt.Sprint(out, err)
	})

	// The other nodes' mounters reach the API server as the mounter pod
	// does: with a token of its service account.
	token := strings.TrimSpace(c.kubectl("create", "token", "bdnvol-csi-mounter", "-n", "kube-system", "--duration=1h"))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	mustWrite(t, kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "https://127.0.0.1:%d", certificate-authority: %q}}]
users: [{name: mounter, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: mounter}}]
current-context: e2e
`, c.apiPort, filepath.Join(c.root, "pki", "ca.crt"), token)))

	mounterPod := strings.TrimPrefix(strings.TrimSpace(c.kubectl("get", "pods", "-n", "kube-system",
		"-l", "app.kubernetes.io/component=mounter", "-o", "name")), "pod/")
	// EndpointSlices refuse loopback addresses: the other nodes listen on
	// the node's address (the mounter pod's, on the host network), each on
	// a port of its own.
	nodeIP := strings.TrimSpace(c.kubectl("get", "pod", "-n", "kube-system", mounterPod, "-o", "jsonpath={.status.podIP}"))
	var nodes []*csiNode
	for i := range 2 {
		l, err := net.Listen("tcp", net.JoinHostPort(nodeIP, "0"))
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		host, port, _ := net.SplitHostPort(addr)
		name := fmt.Sprintf("bdnvol-e2e-node-%d", i)
		c.apply(fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s
  namespace: kube-system
  labels:
    kubernetes.io/service-name: bdnvol-csi-peers
    endpointslice.kubernetes.io/managed-by: e2e.bdnvol.dev
addressType: IPv4
endpoints: [{addresses: [%q], conditions: {ready: true}}]
ports: [{name: peer, port: %s, protocol: TCP}]
`, name, host, port))
		t.Cleanup(func() { c.kubectlErr("delete", "endpointslice", "-n", "kube-system", name) })
		nodes = append(nodes, startCSIEnv(t, []string{"KUBECONFIG=" + kubeconfig}, time.Minute, "1GiB",
			[]string{"--peer-listen", addr, "--peer-service", "kube-system/bdnvol-csi-peers", "--peer-tls-secret", "kube-system/bdnvol-csi-peer-ca"}))
	}
	three := regexp.MustCompile(`"msg":"peer membership".*"members":3\b`)
	c.waitFor("every mounter to see the Service's 3 endpoints", func() (bool, string) {
		logs := []string{c.podLogs("kube-system", mounterPod)}
		for _, n := range nodes {
			logs = append(logs, n.mounterLog.String())
		}
		for _, l := range logs {
			if !three.MatchString(l) {
				return false, l
			}
		}
		return true, ""
	})

	src := filepath.Join(t.TempDir(), "src")
	sums := map[string]string{}
	var tree []node
	for i := range 6 {
		b := randBytes(uint64(70+i), 1<<20+i*4099)
		name := fmt.Sprintf("shard-%d.bin", i)
		sums[name] = fmt.Sprintf("%x", sha256.Sum256(b))
		tree = append(tree, fileNode(name, 0o644, b))
	}
	buildTree(t, src, tree, time.Time{})
	ref := reg.Host + "/team/fleet"
	d := push(t, ref, ref+":v1", src, smallChunks...)

	// Every node opens its mount before any reads: an owner fetches from
	// the registry for its peers only the chunks of an origin it serves a
	// mount of (with that mount's credentials). The pod's mount is open
	// once it runs; it reads a second later, as the other nodes do.
	reg.ResetStats()
	var pods []pod
	for i, n := range nodes {
		p := n.newPod(fmt.Sprintf("fleet-%d", i))
		if err := n.publish(p, ref+"@"+d, ""); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		pods = append(pods, p)
	}
	c.apply(readerPod("fleet-reader", ref+"@"+d, "sleep 1; sha256sum /data/*.bin"))
	c.waitRunning("default", "fleet-reader")
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			compareTrees(t, src, p.target)
		}()
	}
	c.waitFor("pod fleet-reader to print READY", func() (bool, string) {
		l := c.podLogs("default", "fleet-reader")
		return strings.Contains(l, "READY"), l
	})
	wg.Wait()
	l := c.podLogs("default", "fleet-reader")
	for name, sum := range sums {
		if !strings.Contains(l, sum+"  /data/"+name) {
			t.Errorf("the pod on the cluster's node read %s wrong:\n%s", name, l)
		}
	}
	c.kubectl("delete", "pod", "fleet-reader", "--wait=false")

	checkFetchedOnce(t, reg.Stats(), "3 nodes, membership from EndpointSlices", 4)
	if t.Failed() {
		os.Stderr.WriteString(c.podLogs("kube-system", mounterPod))
	}
}
