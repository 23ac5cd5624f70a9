// Command kubeapi runs a Kubernetes API server (etcd and kube-apiserver,
// the releases `make cluster-tools` builds) on loopback for the fleet
// benchmark, so that its mounters get their peer membership from
// EndpointSlices and their CA from a Secret, as they do in a cluster. It
// writes DIR/kubeconfig (an administrator's), creates the empty Secret
// kube-system/bdnvol-csi-peer-ca, prints "ready" and serves until SIGTERM
// or SIGINT, then stops both processes.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	dir := flag.String("dir", "", "where the PKI, etcd's data, the logs and the kubeconfig go")
	tools := flag.String("tools", "", "the tool cache (default $XDG_CACHE_HOME or ~/.cache, then bdnvol-tools)")
	gomod := flag.String("gomod", "internal/tools/k8sbuild/go.mod", "the go.mod that pins the Kubernetes and etcd releases")
	flag.Parse()
	if *dir == "" {
		fail(fmt.Errorf("-dir is required"))
	}
	if err := run(*dir, *tools, *gomod); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kubeapi:", err)
	os.Exit(1)
}

// toolDirs are the directories of the Kubernetes and etcd binaries.
func toolDirs(tools, gomod string) (k8s, etcd string, err error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", "", err
	}
	ver := func(mod string) (string, error) {
		m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(mod) + ` (v\S+)`).FindSubmatch(b)
		if m == nil {
			return "", fmt.Errorf("%s does not require %s", gomod, mod)
		}
		return string(m[1]), nil
	}
	kv, err := ver("k8s.io/kubernetes")
	if err != nil {
		return "", "", err
	}
	ev, err := ver("go.etcd.io/etcd/server/v3")
	if err != nil {
		return "", "", err
	}
	if tools == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		tools = filepath.Join(cache, "bdnvol-tools")
	}
	k8s, etcd = filepath.Join(tools, "kubernetes-"+kv), filepath.Join(tools, "etcd-"+ev)
	for _, p := range []string{filepath.Join(k8s, "kube-apiserver"), filepath.Join(k8s, "kubectl"), filepath.Join(etcd, "etcd")} {
		if _, err := os.Stat(p); err != nil {
			return "", "", fmt.Errorf("%w (make cluster-tools builds it)", err)
		}
	}
	return k8s, etcd, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func run(dir, tools, gomod string) error {
	k8s, etcd, err := toolDirs(tools, gomod)
	if err != nil {
		return err
	}
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return err
	}
	apiPort, err := freePort()
	if err != nil {
		return err
	}
	etcdPort, _ := freePort()
	peerPort, _ := freePort()
	if err := writePKI(pki); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: bench, cluster: {server: "https://127.0.0.1:%d", certificate-authority: %q}}]
users: [{name: admin, user: {client-certificate: %q, client-key: %q}}]
contexts: [{name: bench, context: {cluster: bench, user: admin}}]
current-context: bench
`, apiPort, filepath.Join(pki, "ca.crt"), filepath.Join(pki, "admin.crt"), filepath.Join(pki, "admin.key"))
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var procs []*exec.Cmd
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { procs[i].Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				procs[i].Process.Kill()
				<-done
			}
		}
	}()
	start := func(name, path string, args ...string) error {
		log, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return err
		}
		cmd := exec.Command(path, args...)
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return err
		}
		procs = append(procs, cmd)
		return nil
	}
	u := func(p int) string { return "http://127.0.0.1:" + strconv.Itoa(p) }
	if err := start("etcd", filepath.Join(etcd, "etcd"), "--name=bench", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+u(etcdPort), "--advertise-client-urls="+u(etcdPort),
		"--listen-peer-urls="+u(peerPort), "--initial-advertise-peer-urls="+u(peerPort),
		"--initial-cluster=bench="+u(peerPort), "--unsafe-no-fsync", "--listen-metrics-urls=", "--log-level=warn"); err != nil {
		return err
	}
	p := func(f string) string { return filepath.Join(pki, f) }
	if err := start("kube-apiserver", filepath.Join(k8s, "kube-apiserver"),
		"--etcd-servers="+u(etcdPort), "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(apiPort), "--endpoint-reconciler-type=none",
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--client-ca-file="+p("ca.crt"),
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc", "--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=AlwaysAllow", "--profiling=false", "-v=0"); err != nil {
		return err
	}
	kubectl := func(stdin string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(k8s, "kubectl"), append([]string{"--kubeconfig", kubeconfig, "--request-timeout=20s"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := kubectl("", "get", "--raw", "/readyz")
		if err == nil && strings.TrimSpace(out) == "ok" {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the API server is not ready: %s %v (logs in %s)", out, err, dir)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if out, err := kubectl("apiVersion: v1\nkind: Secret\nmetadata: {name: bdnvol-csi-peer-ca, namespace: kube-system}\ntype: Opaque\n", "apply", "-f", "-"); err != nil {
		return fmt.Errorf("the CA Secret: %s %v", out, err)
	}
	fmt.Println("ready")
	<-ctx.Done()
	return nil
}

// writePKI writes a CA, the API server's certificate, an administrator's
// client certificate and the service account key pair into dir.
func writePKI(dir string) error {
	write := func(name, typ string, der []byte) error {
		return os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
	}
	type pair struct {
		cert *x509.Certificate
		key  *ecdsa.PrivateKey
	}
	serial := int64(1)
	issue := func(tmpl *x509.Certificate, parent *pair, name string) (*pair, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(48*time.Hour)
		signer, parentCert := key, tmpl
		if parent != nil {
			signer, parentCert = parent.key, parent.cert
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, &key.PublicKey, signer)
		if err != nil {
			return nil, err
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := write(name+".crt", "CERTIFICATE", der); err != nil {
			return nil, err
		}
		return &pair{cert, key}, write(name+".key", "EC PRIVATE KEY", kder)
	}
	ca, err := issue(&x509.Certificate{Subject: pkix.Name{CommonName: "bdnvol-bench-ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil, "ca")
	if err != nil {
		return err
	}
	if _, err := issue(&x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, "apiserver"); err != nil {
		return err
	}
	if _, err := issue(&x509.Certificate{Subject: pkix.Name{CommonName: "bdnvol-bench-admin", Organization: []string{"system:masters"}},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca, "admin"); err != nil {
		return err
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	if err := write("sa.key", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	return write("sa.pub", "PUBLIC KEY", pub)
}
