package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// csiNode is the node plugin of one test node: the real `bdnvol csi
// mounter` and `bdnvol csi node` processes, and a gRPC connection playing
// kubelet.
type csiNode struct {
	t         *testing.T
	root      string // everything of this node lives under it
	mountsDir string
	stateDir  string
	cacheDir  string
	mounterS  string // the mounter's socket
	endpoint  string // the CSI socket
	globals   []string
	env       []string // added to the processes' environment
	linger    time.Duration
	// mounterFlags are extra flags of `bdnvol csi mounter` (startCSIWith).
	mounterFlags []string
	// nodeFlags are extra flags of `bdnvol csi node` (restartNodeWith).
	nodeFlags []string
	cacheSize string

	mounter, node *exec.Cmd
	mounterLog    *syncBuffer
	nodeLog       *syncBuffer
	conn          *grpc.ClientConn
	Node          csi.NodeClient
	Identity      csi.IdentityClient
}

// syncBuffer is a bytes.Buffer safe for a process's output and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor reports whether every one of subs is in the buffer within d.
func (s *syncBuffer) waitFor(d time.Duration, subs ...string) bool {
	deadline := time.Now().Add(d)
	for {
		all := true
		text := s.String()
		for _, sub := range subs {
			if !strings.Contains(text, sub) {
				all = false
				break
			}
		}
		if all {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startCSI starts a node plugin with the given global flags (--ca-file ...).
// Everything it mounts is removed in t.Cleanup.
func startCSI(t *testing.T, linger time.Duration, globals ...string) *csiNode {
	t.Helper()
	return startCSIWith(t, linger, "1GiB", nil, globals...)
}

// startCSIWith is startCSI with the mounter's cache size and extra flags.
func startCSIWith(t *testing.T, linger time.Duration, cacheSize string, mounterFlags []string, globals ...string) *csiNode {
	t.Helper()
	return startCSIEnv(t, nil, linger, cacheSize, mounterFlags, globals...)
}

// startCSIEnv is startCSIWith with env added to the processes'
// environment.
func startCSIEnv(t *testing.T, env []string, linger time.Duration, cacheSize string, mounterFlags []string, globals ...string) *csiNode {
	t.Helper()
	requireFUSE(t)
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the CSI node plugin needs root (bind mounts); CI=true must run as root")
		}
		t.Skip("the CSI node plugin needs root (bind mounts)")
	}
	// Short paths: unix socket names are limited to 108 bytes.
	root, err := os.MkdirTemp("", "bdnvol-csi-")
	if err != nil {
		t.Fatal(err)
	}
	n := &csiNode{t: t, root: root, globals: globals, env: env, linger: linger, mounterFlags: mounterFlags, cacheSize: cacheSize,
		mountsDir: filepath.Join(root, "plugin", "mounts"),
		stateDir:  filepath.Join(root, "state"),
		cacheDir:  filepath.Join(root, "cache"),
		mounterS:  filepath.Join(root, "plugin", "mounter.sock"),
		endpoint:  filepath.Join(root, "plugin", "csi.sock"),
	}
	t.Cleanup(func() {
		n.stopNode()
		if n.mounter != nil && n.mounter.Process != nil {
			n.mounter.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { n.mounter.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				n.mounter.Process.Kill()
				<-done
			}
		}
		// Whatever is still mounted under root (a failed test): detach it.
		b, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && strings.HasPrefix(f[4], root) {
				detachMount(f[4])
			}
		}
		if t.Failed() {
			t.Logf("mounter log:\n%s", n.mounterLog)
			t.Logf("node log:\n%s", n.nodeLog)
		}
		os.RemoveAll(root)
	})
	n.startMounter()
	n.startNode()
	return n
}

func (n *csiNode) cmd(log *syncBuffer, args ...string) *exec.Cmd {
	if args[0] == "node" {
		args = append(args, n.nodeFlags...)
	}
	cmd := exec.Command(bin(n.t), append(append([]string{"csi"}, args...), n.globals...)...)
	cmd.Env = append(cliEnv(n.t), n.env...)
	cmd.Stdout, cmd.Stderr = log, log
	return cmd
}

func (n *csiNode) startMounter() {
	n.t.Helper()
	n.mounterLog = &syncBuffer{}
	os.Remove(n.mounterS) // a killed mounter leaves its socket: wait for the new one
	n.mounter = n.cmd(n.mounterLog, "mounter", "--mounts-dir", n.mountsDir, "--mounter-socket", n.mounterS,
		"--state-dir", n.stateDir, "--cache-dir", n.cacheDir, "--cache-size", n.cacheSize, "--hosts-dir", "none")
	n.mounter.Args = append(n.mounter.Args, n.mounterFlags...)
	if err := n.mounter.Start(); err != nil {
		n.t.Fatal(err)
	}
	waitSocket(n.t, n.mounterS, n.mounterLog)
}

// startNode starts (or restarts) the node plugin and connects to it.
func (n *csiNode) startNode() {
	n.t.Helper()
	n.nodeLog = &syncBuffer{}
	os.Remove(n.endpoint)
	n.node = n.cmd(n.nodeLog, "node", "--endpoint", "unix://"+n.endpoint, "--node-id", "e2e-node",
		"--mounts-dir", n.mountsDir, "--mounter-socket", n.mounterS, "--state-dir", n.stateDir, "--linger", n.linger.String(),
		"--kubelet-dir", n.root) // targets (pods/..., sanity/...) are all under root
	if err := n.node.Start(); err != nil {
		n.t.Fatal(err)
	}
	waitSocket(n.t, n.endpoint, n.nodeLog)
	conn, err := grpc.NewClient("unix://"+n.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		n.t.Fatal(err)
	}
	n.conn = conn
	n.Node = csi.NewNodeClient(conn)
	n.Identity = csi.NewIdentityClient(conn)
}

// restartNodeWith stops the node plugin and starts it again with flags.
func (n *csiNode) restartNodeWith(flags ...string) {
	n.t.Helper()
	n.stopNode()
	n.nodeFlags = flags
	n.startNode()
}

// kill9Node kills the node plugin with SIGKILL.
func (n *csiNode) kill9Node() {
	n.t.Helper()
	if err := n.node.Process.Signal(syscall.SIGKILL); err != nil {
		n.t.Fatal(err)
	}
	n.node.Wait()
	n.conn.Close()
	n.node = nil
}

// kill9Mounter kills the mounter with SIGKILL: its FUSE mounts stay in the
// mount table with no server, as after a crash or an OOM kill.
func (n *csiNode) kill9Mounter() {
	n.t.Helper()
	if err := n.mounter.Process.Signal(syscall.SIGKILL); err != nil {
		n.t.Fatal(err)
	}
	n.mounter.Wait()
	n.mounter = nil
}

func (n *csiNode) stopNode() {
	if n.conn != nil {
		n.conn.Close()
	}
	if n.node != nil && n.node.Process != nil {
		n.node.Process.Signal(syscall.SIGTERM)
		n.node.Wait()
		n.node = nil
	}
}

func waitSocket(t *testing.T, path string, log *syncBuffer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no socket at %s after 30s:\n%s", path, log)
}

// pod is one pod's volume: where kubelet asks the plugin to publish it.
type pod struct {
	name     string
	volumeID string
	target   string
}

// newPod returns a pod whose target path's parent exists, as kubelet makes it.
func (n *csiNode) newPod(name string) pod {
	n.t.Helper()
	dir := filepath.Join(n.root, "pods", name, "volumes", "kubernetes.io~csi", "vol")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		n.t.Fatal(err)
	}
	return pod{name: name, volumeID: "csi-" + name, target: filepath.Join(dir, "mount")}
}

// publish is NodePublishVolume of ref for p, as kubelet sends it for an
// inline volume; secret is a docker config JSON ("" for none).
func (n *csiNode) publish(p pod, ref, secret string) error {
	n.t.Helper()
	return n.publishWith(p, ref, secret, nil)
}

// publishWith is publish with more volume attributes (over the defaults).
func (n *csiNode) publishWith(p pod, ref, secret string, attrs map[string]string) error {
	n.t.Helper()
	req := &csi.NodePublishVolumeRequest{
		VolumeId:   p.volumeID,
		TargetPath: p.target,
		Readonly:   true,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		VolumeContext: map[string]string{
			"ref": ref, "prefetch": "none",
			"csi.storage.k8s.io/pod.name": p.name, "csi.storage.k8s.io/pod.namespace": "e2e",
			"csi.storage.k8s.io/ephemeral": "true",
		},
	}
	for k, v := range attrs {
		req.VolumeContext[k] = v
	}
	if secret != "" {
		req.Secrets = map[string]string{".dockerconfigjson": secret}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := n.Node.NodePublishVolume(ctx, req)
	return err
}

func (n *csiNode) mustPublish(p pod, ref, secret string) {
	n.t.Helper()
	if err := n.publish(p, ref, secret); err != nil {
		n.t.Fatalf("NodePublishVolume %s for %s: %v", ref, p.name, err)
	}
}

func (n *csiNode) unpublish(p pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := n.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: p.volumeID, TargetPath: p.target})
	return err
}

// fuseMounts lists the digests the mounter serves: the FUSE mounts under
// its mounts directory (bind mounts at pods' targets are not counted).
func (n *csiNode) fuseMounts() map[string]string {
	n.t.Helper()
	out := map[string]string{}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		n.t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || !strings.HasPrefix(f[4], n.mountsDir+"/") {
			continue
		}
		for i := 6; i+2 < len(f); i++ {
			if f[i] == "-" && f[i+1] == "fuse.bdnvol" {
				out[f[4]] = strings.TrimPrefix(f[i+2], "bdnvol@")
			}
		}
	}
	return out
}

// dockerConfig is a docker config JSON with one credential for host.
func dockerConfig(host, user, pass string) string {
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{
		host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))},
	}})
	return string(b)
}

// blobGets returns the blob GETs the proxy saw, by digest, since its last Set.
func (p *faultProxy) blobGets() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.gets {
		out[k] = v
	}
	return out
}
