package e2e

// A real single-node Kubernetes cluster for the cluster tests: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, containerd and
// kubelet as child processes of the test, on loopback only, with images
// imported into containerd instead of pulled. Everything it starts and
// mounts is stopped and unmounted in t.Cleanup, on failure too.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	kubeletDir   = "/var/lib/kubelet" // the manifests' hostPaths assume it
	bdnvolDir    = "/var/lib/bdnvol"  // the plugin's state and chunk cache (hostPath)
	clusterMark  = ".bdnvol-e2e"      // marks a kubelet dir this harness created
	imgBdnvol    = "bdnvol.test/bdnvol:e2e"
	imgPause     = "bdnvol.test/pause:e2e"
	imgBusybox   = "bdnvol.test/busybox:e2e"
	clusterWait  = 3 * time.Minute // generous: the machine is shared and loaded
	kubectlLimit = 90 * time.Second
)

// clusterTools returns the directories holding the Kubernetes and etcd
// binaries `make cluster-tools` builds, at the versions of the wrapper
// module's go.mod.
func clusterTools(t *testing.T) (k8s, etcd, k8sVersion, etcdVersion string) {
	t.Helper()
	b, err := os.ReadFile("../internal/tools/k8sbuild/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	ver := func(mod string) string {
		m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(mod) + ` (v\S+)`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("internal/tools/k8sbuild/go.mod does not require %s", mod)
		}
		return string(m[1])
	}
	k8sVersion, etcdVersion = ver("k8s.io/kubernetes"), ver("go.etcd.io/etcd/server/v3")
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	tools := filepath.Join(cache, "bdnvol-tools")
	return filepath.Join(tools, "kubernetes-"+k8sVersion), filepath.Join(tools, "etcd-"+etcdVersion), k8sVersion, etcdVersion
}

// requireCluster fails the test under CI=true, and skips it otherwise, unless
// everything a cluster needs is here.
func requireCluster(t *testing.T) (k8s, etcd string) {
	t.Helper()
	requireFUSE(t)
	k8s, etcd, _, _ = clusterTools(t)
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (kubelet, containerd and bind mounts)")
	}
	for _, p := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"} {
		if _, err := os.Stat(filepath.Join(k8s, p)); err != nil {
			missing = append(missing, filepath.Join(k8s, p)+" (make cluster-tools)")
		}
	}
	if _, err := os.Stat(filepath.Join(etcd, "etcd")); err != nil {
		missing = append(missing, filepath.Join(etcd, "etcd")+" (make cluster-tools)")
	}
	for _, p := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p+" (make cluster-deps)")
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		missing = append(missing, "/bin/busybox (make cluster-deps)")
	}
	if len(missing) == 0 {
		return k8s, etcd
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("the cluster tests need: %s", strings.Join(missing, ", "))
	}
	t.Skipf("the cluster tests need: %s", strings.Join(missing, ", "))
	return
}

// cluster is a running single-node cluster.
type cluster struct {
	t          *testing.T
	root       string // certificates, configs, logs, etcd's and containerd's state
	k8s, etcd  string // tool directories
	kubeconfig string
	ctrSock    string
	apiPort    int
	logs       []string // log files, dumped on failure
	procs      []*clusterProc
}

// clusterProc is one process of the cluster, in its own process group.
type clusterProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startCluster starts a cluster and waits until its node is Ready.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	k8s, etcd := requireCluster(t)
	root, err := os.MkdirTemp("", "bdnvol-k8s-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, root: root, k8s: k8s, etcd: etcd, ctrSock: filepath.Join(root, "containerd.sock")}
	for _, d := range []string{"pki", "logs", "etcd", "cni/net.d", "cni/bin", "containerd/root", "containerd/state"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// kubelet's pod logs, removed after the run unless they were here before.
	var logDirs []string
	for _, d := range []string{"/var/log/pods", "/var/log/containers"} {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			logDirs = append(logDirs, d)
		}
	}
	// Registered first, so it runs last: every mount left, then the files.
	t.Cleanup(func() {
		for _, d := range logDirs {
			os.RemoveAll(d)
		}
		unmountUnder(kubeletDir + "/")
		unmountUnder(root + "/")
		unmountUnder(kubeletDir)
		os.RemoveAll(kubeletDir)
		os.RemoveAll(bdnvolDir)
		os.RemoveAll(root)
	})
	c.prepareKubeletDir()
	c.apiPort = freePort(t)
	c.writePKI()

	c.startContainerd()
	etcdPort, peerPort := freePort(t), freePort(t)
	c.start("etcd", filepath.Join(etcd, "etcd"),
		"--name=e2e", "--data-dir="+filepath.Join(root, "etcd"),
		"--listen-client-urls=http://127.0.0.1:"+strconv.Itoa(etcdPort),
		"--advertise-client-urls=http://127.0.0.1:"+strconv.Itoa(etcdPort),
		"--listen-peer-urls=http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-advertise-peer-urls=http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-cluster=e2e=http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--unsafe-no-fsync", "--listen-metrics-urls=", "--log-level=warn")

	pki := func(f string) string { return filepath.Join(root, "pki", f) }
	c.start("kube-apiserver", filepath.Join(k8s, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:"+strconv.Itoa(etcdPort),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(c.apiPort),
		"--endpoint-reconciler-type=none",
		"--tls-cert-file="+pki("apiserver.crt"), "--tls-private-key-file="+pki("apiserver.key"),
		"--client-ca-file="+pki("ca.crt"),
		"--kubelet-client-certificate="+pki("admin.crt"), "--kubelet-client-key="+pki("admin.key"),
		"--kubelet-preferred-address-types=Hostname", // localhost: the node's InternalIP is not loopback
		"--service-account-key-file="+pki("sa.pub"),
		"--service-account-signing-key-file="+pki("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=AlwaysAllow", "--allow-privileged=true",
		"--profiling=false", "-v=1")
	c.waitFor("the API server to be ready", func() (bool, string) {
		out, err := c.kubectlErr("get", "--raw", "/readyz")
		return err == nil && strings.TrimSpace(out) == "ok", out
	})
	c.start("kube-controller-manager", filepath.Join(k8s, "kube-controller-manager"),
		"--kubeconfig="+c.kubeconfig, "--leader-elect=false",
		"--service-account-private-key-file="+pki("sa.key"), "--root-ca-file="+pki("ca.crt"),
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(freePort(t)),
		"--profiling=false", "-v=1")
	c.start("kube-scheduler", filepath.Join(k8s, "kube-scheduler"),
		"--kubeconfig="+c.kubeconfig, "--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(freePort(t)),
		"--profiling=false", "-v=1")
	c.startKubelet()
	c.waitFor("the node to be Ready", func() (bool, string) {
		out, err := c.kubectlErr("get", "node", "localhost", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == "True", out
	})
	// The default service account, which admission requires of every pod.
	c.waitFor("the default service account", func() (bool, string) {
		out, err := c.kubectlErr("get", "serviceaccount", "default", "-o", "name")
		return err == nil, out
	})
	// Registered last, so it runs first, while everything still runs.
	t.Cleanup(func() {
		if t.Failed() {
			c.dump()
		}
	})
	return c
}

// prepareKubeletDir makes /var/lib/kubelet a shared mount of its own (the
// root is private here, without systemd), so that Bidirectional propagation
// works; it refuses a kubelet directory this harness did not create.
func (c *cluster) prepareKubeletDir() {
	t := c.t
	if ents, err := os.ReadDir(kubeletDir); err == nil && len(ents) > 0 {
		if _, err := os.Stat(filepath.Join(kubeletDir, clusterMark)); err != nil {
			t.Fatalf("%s exists and was not made by these tests: is a kubelet running here? Not touching it", kubeletDir)
		}
	}
	// A previous run that was killed may have left mounts and state.
	unmountUnder(kubeletDir + "/")
	unmountUnder(kubeletDir)
	if err := os.RemoveAll(kubeletDir); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(bdnvolDir)
	if err := os.MkdirAll(kubeletDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := bindShared(kubeletDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kubeletDir, clusterMark), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// unmountUnder detaches every mount at or below prefix, deepest first.
func unmountUnder(prefix string) {
	for i := 0; i < 5; i++ {
		var mps []string
		b, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && (strings.HasPrefix(f[4], prefix) || f[4] == strings.TrimSuffix(prefix, "/")) {
				mps = append(mps, unescapeMount(f[4]))
			}
		}
		if len(mps) == 0 {
			return
		}
		sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
		for _, mp := range mps {
			detachMount(mp)
		}
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// start starts a cluster process in its own process group, logging to a
// file; t.Cleanup stops the group (TERM, then KILL).
func (c *cluster) start(name, path string, args ...string) *clusterProc {
	c.t.Helper()
	logPath := filepath.Join(c.root, "logs", name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	c.logs = append(c.logs, logPath)
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	if err := cmd.Start(); err != nil {
		lf.Close()
		c.t.Fatalf("start %s: %v", name, err)
	}
	p := &clusterProc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	c.procs = append(c.procs, p)
	go func() { cmd.Wait(); lf.Close(); close(p.done) }()
	c.t.Cleanup(func() { p.stop(15 * time.Second) })
	return p
}

// stop ends the process group: SIGTERM, then SIGKILL after grace.
func (p *clusterProc) stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

// running reports whether the process has not exited.
func (p *clusterProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// waitFor polls cond every half second until it holds, failing the test
// with what cond last said after clusterWait.
func (c *cluster) waitFor(what string, cond func() (bool, string)) {
	c.t.Helper()
	c.waitForIn(clusterWait, what, cond)
}

func (c *cluster) waitForIn(limit time.Duration, what string, cond func() (bool, string)) {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	var last string
	for {
		ok, s := cond()
		if ok {
			return
		}
		for _, p := range c.procs {
			if !p.running() {
				b, _ := os.ReadFile(p.log)
				if len(b) > 8000 {
					b = b[len(b)-8000:]
				}
				c.t.Fatalf("waiting for %s: %s exited (%v); the end of its log:\n%s", what, p.name, p.cmd.ProcessState, b)
			}
		}
		last = s
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %v waiting for %s; last: %s", limit, what, strings.TrimSpace(last))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// kubectlErr runs kubectl against the cluster, returning its standard output
// (and its standard error in the error).
func (c *cluster) kubectlErr(args ...string) (string, error) {
	return c.kubectlIn("", args...)
}

func (c *cluster) kubectlIn(stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), kubectlLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.k8s, "kubectl"), append([]string{"--kubeconfig=" + c.kubeconfig}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// kubectl is kubectlErr that fails the test on error.
func (c *cluster) kubectl(args ...string) string {
	c.t.Helper()
	out, err := c.kubectlErr(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// apply applies YAML or JSON objects.
func (c *cluster) apply(objs string) {
	c.t.Helper()
	if out, err := c.kubectlIn(objs, "apply", "-f", "-"); err != nil {
		c.t.Fatalf("%v\n%s", err, out)
	}
}

// dump logs what explains a failure: the cluster's objects and events, the
// pods' descriptions and logs, and the tail of every process's log.
func (c *cluster) dump() {
	t := c.t
	for _, args := range [][]string{
		{"get", "nodes,daemonsets,pods,csinodes", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		{"describe", "pods", "-A"},
	} {
		out, err := c.kubectlErr(args...)
		t.Logf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	out, _ := c.kubectlErr("get", "pods", "-A", "-o", `jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}`)
	for _, nn := range strings.Fields(out) {
		ns, name, _ := strings.Cut(nn, "/")
		logs, err := c.kubectlErr("logs", "-n", ns, name, "--all-containers", "--tail=80")
		t.Logf("logs of %s: %v\n%s", nn, err, logs)
	}
	for _, l := range c.logs {
		b, _ := os.ReadFile(l)
		lines := strings.Split(string(b), "\n")
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		t.Logf("--- tail of %s ---\n%s", l, strings.Join(lines, "\n"))
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var ms []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, kubeletDir) {
			ms = append(ms, line)
		}
	}
	t.Logf("mounts under %s:\n%s", kubeletDir, strings.Join(ms, "\n"))
}

// --- certificates ---

type clusterKey struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func (c *cluster) writePKI() {
	t := c.t
	dir := filepath.Join(c.root, "pki")
	write := func(name string, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	serial := int64(1)
	issue := func(tmpl *x509.Certificate, parent *clusterKey, name string) *clusterKey {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore = time.Now().Add(-time.Hour)
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
		signer, parentCert := key, tmpl
		if parent != nil {
			signer, parentCert = parent.key, parent.cert
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, &key.PublicKey, signer)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		kder, _ := x509.MarshalECPrivateKey(key)
		write(name+".crt", "CERTIFICATE", der)
		write(name+".key", "EC PRIVATE KEY", kder)
		return &clusterKey{cert: cert, key: key}
	}
	ca := issue(&x509.Certificate{Subject: pkix.Name{CommonName: "bdnvol-e2e-ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil, "ca")
	issue(&x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, "apiserver")
	issue(&x509.Certificate{Subject: pkix.Name{CommonName: "bdnvol-e2e-admin", Organization: []string{"system:masters"}},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca, "admin")
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	write("sa.key", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa))
	pub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	write("sa.pub", "PUBLIC KEY", pub)

	c.kubeconfig = filepath.Join(c.root, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority: %s
users:
- name: admin
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
`, c.apiPort, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key"))
	if err := os.WriteFile(c.kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
}

// --- containerd and kubelet ---

func (c *cluster) startContainerd() {
	t := c.t
	// Host-network pods only: a loopback-only CNI configuration makes the
	// runtime report its network ready; no plugin binary is ever run.
	if err := os.WriteFile(filepath.Join(c.root, "cni/net.d/10-loopback.conflist"),
		[]byte(`{"cniVersion": "0.4.0", "name": "lo", "plugins": [{"type": "loopback"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and runc
	// fails every sandbox that lowers its OOM score.
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(c.root, "containerd/root"), filepath.Join(c.root, "containerd/state"),
		c.ctrSock, c.ctrSock+".ttrpc", imgPause,
		filepath.Join(c.root, "cni/bin"), filepath.Join(c.root, "cni/net.d"))
	confPath := filepath.Join(c.root, "containerd.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	// Runs after containerd stops (Cleanup is LIFO): the shims of this
	// containerd, found by its socket on their command line.
	t.Cleanup(c.killShims)
	c.start("containerd", "containerd", "--config", confPath)
	// Runs before containerd stops: kill every container it runs.
	t.Cleanup(c.killTasks)
	c.waitFor("containerd", func() (bool, string) {
		out, err := c.ctr("version")
		return err == nil, out + fmt.Sprint(err)
	})
}

// ctr runs ctr against this containerd, in the CRI's namespace.
func (c *cluster) ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.ctrSock, "-n", "k8s.io"}, args...)...).CombinedOutput()
	return string(out), err
}

func (c *cluster) killTasks() {
	out, err := c.ctr("tasks", "ls", "-q")
	if err != nil {
		return
	}
	ids := strings.Fields(out)
	for _, id := range ids {
		c.ctr("tasks", "kill", "-a", "-s", "SIGKILL", id)
	}
	for _, id := range ids {
		c.ctr("tasks", "delete", "-f", id)
	}
}

func (c *cluster) killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("containerd-shim")) || !bytes.Contains(b, []byte(c.ctrSock)) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (c *cluster) startKubelet() {
	t := c.t
	port := freePort(t)
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%s
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzPort: 0
failSwapOn: false
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {clientCAFile: %q}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
serializeImagePulls: false
`, c.ctrSock, port, filepath.Join(c.root, "pki/ca.crt"))
	confPath := filepath.Join(c.root, "kubelet.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c.start("kubelet", filepath.Join(c.k8s, "kubelet"),
		"--config="+confPath, "--kubeconfig="+c.kubeconfig,
		"--root-dir="+kubeletDir, "--cert-dir="+filepath.Join(c.root, "kubelet-pki"),
		"--hostname-override=localhost", "-v=2")
}

// --- images, built here and imported: nothing is pulled ---

// importImages imports the pause, busybox and bdnvol images.
func (c *cluster) importImages(b *imageBuilds) {
	t := c.t
	for ref, tarPath := range b.images(t) {
		if out, err := c.ctr("images", "import", tarPath); err != nil {
			t.Fatalf("ctr images import %s: %v\n%s", ref, err, out)
		}
	}
	out, _ := c.ctr("images", "ls", "-q")
	for _, ref := range []string{imgPause, imgBusybox, imgBdnvol} {
		if !strings.Contains(out, ref) {
			t.Fatalf("image %s not in containerd after import:\n%s", ref, out)
		}
	}
}

// podLogs returns a container's log.
func (c *cluster) podLogs(ns, pod string) string {
	out, _ := c.kubectlErr("logs", "-n", ns, pod)
	return out
}

// events returns the messages of the events about an object.
func (c *cluster) events(ns, name string) string {
	out, _ := c.kubectlErr("get", "events", "-n", ns, "--field-selector", "involvedObject.name="+name,
		"-o", `jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}`)
	return out
}

// podPhase returns a pod's phase, or "" when it cannot be read.
func (c *cluster) podPhase(ns, pod string) string {
	out, _ := c.kubectlErr("get", "pod", "-n", ns, pod, "-o", "jsonpath={.status.phase}")
	return out
}

// waitRunning waits for a pod to be Running with its containers ready.
func (c *cluster) waitRunning(ns, pod string) {
	c.t.Helper()
	c.waitFor("pod "+ns+"/"+pod+" to run", func() (bool, string) {
		out, err := c.kubectlErr("get", "pod", "-n", ns, pod, "-o", `jsonpath={.status.phase} {.status.containerStatuses[*].ready}`)
		return err == nil && out == "Running true", out + " " + c.events(ns, pod)
	})
}

// waitGone waits for an object to be deleted.
func (c *cluster) waitGone(args ...string) {
	c.t.Helper()
	c.waitFor(strings.Join(args, " ")+" to be gone", func() (bool, string) {
		out, err := c.kubectlErr(append([]string{"get", "--ignore-not-found", "-o", "name"}, args...)...)
		return err == nil && strings.TrimSpace(out) == "", out
	})
}

// fuseDevices returns the distinct devices of the FUSE mounts under dir on
// the host: one per file system, however many bind mounts show it.
func fuseDevices(dir string) map[string]bool {
	devs := map[string]bool{}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return devs
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if strings.HasPrefix(fields[sep+1], "fuse") && strings.HasPrefix(fields[4], dir) {
			devs[fields[2]] = true
		}
	}
	return devs
}

// jsonString quotes s for a JSON or YAML document.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
