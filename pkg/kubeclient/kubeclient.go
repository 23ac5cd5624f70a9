// Package kubeclient is bdnvol's one way to reach a Kubernetes API server:
// the client configuration of a kubeconfig context, resolved by client-go's
// clientcmd as kubectl resolves it, or of the pod's own service account.
//
// Config hardens what client-go leaves open to hostile input: a kubeconfig,
// CA, token or client-key file that is a FIFO or a device is refused before
// client-go opens it (an open of a FIFO blocks with no way to cancel it), a
// credential plugin runs with a deadline and a bounded output and is not
// waited for beyond its own exit (client-go's waits for every process that
// holds its standard output), and every response body is bounded. Callers
// build the client they need from the configuration: the dynamic client
// (k8s.io/client-go/dynamic) or one typed group client (for example
// k8s.io/client-go/kubernetes/typed/discovery/v1 for EndpointSlices) rather
// than the whole clientset, which would add every API group to the binary.
package kubeclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// InCluster is the name Config returns for the pod's own cluster, reached
// through its service account.
const InCluster = "in-cluster"

// MaxResponseBytes bounds the body of one response a client reads, a watch
// stream's excepted (it is read event by event).
const MaxResponseBytes = 64 << 20

// maxFileBytes bounds a file a client reads (kubeconfig, CA, token, client
// key).
const maxFileBytes = 4 << 20

// serviceAccountDir holds a pod's service account token and CA (a variable
// for tests).
var serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// ErrNoConfig is returned by Config when there is no kubeconfig and the
// process does not run in a pod.
var ErrNoConfig = errors.New("no kubeconfig (KUBECONFIG or ~/.kube/config) and not in a pod (KUBERNETES_SERVICE_HOST is not set)")

// Config returns the client configuration of the kubeconfig context name
// (the current context when name is empty) and the context's name. The
// kubeconfig is the files KUBECONFIG lists, merged as kubectl merges them,
// else ~/.kube/config; with none and no name, it is the pod's own cluster
// through its service account, named InCluster. The configuration is
// bounded as the package documentation says; building a client from it
// reads no file that Config has not checked. It sets no request timeout
// (rest.Config.Timeout would end a watch too): a caller that lists sets
// one. A credential plugin the context names runs once in Config (under
// ctx), and again when its token expires or is refused.
func Config(ctx context.Context, name string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.MigrationRules = nil // kubectl's copy of a pre-2015 ~/.kube/.kubeconfig: a read-only command writes nothing
	rules.WarnIfAllMissing = false
	for _, p := range rules.GetLoadingPrecedence() {
		if err := checkFile(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, "", fmt.Errorf("kubeconfig: %w", err)
		}
	}
	raw, err := rules.Load()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	if len(raw.Contexts) == 0 && raw.CurrentContext == "" {
		if name != "" {
			return nil, "", fmt.Errorf("context %q: no kubeconfig (KUBECONFIG or ~/.kube/config)", name)
		}
		cfg, err := inCluster(serviceAccountDir)
		if err != nil {
			return nil, "", err
		}
		return harden(cfg), InCluster, nil
	}
	if name == "" {
		name = raw.CurrentContext
	}
	if name == "" {
		return nil, "", errors.New("kubeconfig: no current context; name one: k8s://CONTEXT")
	}
	kctx, ok := raw.Contexts[name]
	if !ok {
		return nil, "", fmt.Errorf("kubeconfig: no context %q", name)
	}
	if err := checkContextFiles(raw, kctx); err != nil {
		return nil, "", fmt.Errorf("kubeconfig: context %q: %w", name, err)
	}
	cfg, err := clientcmd.NewNonInteractiveClientConfig(*raw, name, &clientcmd.ConfigOverrides{}, rules).ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: context %q: %w", name, err)
	}
	if cfg.ExecProvider != nil {
		if err := useExecPlugin(ctx, cfg); err != nil {
			return nil, "", fmt.Errorf("kubeconfig: context %q: %w", name, err)
		}
	}
	return harden(cfg), name, nil
}

// checkContextFiles checks the files the context's cluster and user name,
// which client-go reads when it builds a client.
func checkContextFiles(raw *clientcmdapi.Config, kctx *clientcmdapi.Context) error {
	var files []string
	if c := raw.Clusters[kctx.Cluster]; c != nil {
		files = append(files, c.CertificateAuthority)
	}
	if u := raw.AuthInfos[kctx.AuthInfo]; u != nil {
		if u.AuthProvider != nil {
			return fmt.Errorf("user %q: auth-provider credentials are not supported; use a token or an exec plugin", kctx.AuthInfo)
		}
		files = append(files, u.TokenFile, u.ClientCertificate, u.ClientKey)
	}
	for _, f := range files {
		if f == "" {
			continue
		}
		if err := checkFile(f); err != nil {
			return err
		}
	}
	return nil
}

// inCluster is the configuration of the pod's own cluster as
// rest.InClusterConfig builds it (the API server's service address, the
// service account's CA and its token file, which client-go re-reads as the
// kubelet rotates it), from the service account in dir.
func inCluster(dir string) (*rest.Config, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, ErrNoConfig
	}
	token, ca := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	for _, f := range []string{token, ca} {
		if err := checkFile(f); err != nil {
			return nil, fmt.Errorf("in-cluster: %w", err)
		}
	}
	return &rest.Config{
		Host:            "https://" + net.JoinHostPort(host, port),
		TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
		BearerTokenFile: token,
	}, nil
}

// harden sets the bounds every client of the code base shares on cfg.
func harden(cfg *rest.Config) *rest.Config {
	cfg.UserAgent = "bdnvol"
	if cfg.QPS == 0 {
		// kubectl's rate, not client-go's default of 5 requests a second:
		// a paged read of a large cluster is hundreds of requests.
		cfg.QPS, cfg.Burst = 50, 300
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return limitTransport{rt} })
	return cfg
}

// checkFile returns an error unless p is a regular file of at most
// maxFileBytes. It opens p without blocking, so that a FIFO is refused
// rather than waited on.
func checkFile(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s is not a regular file", p)
	}
	if st.Size > maxFileBytes {
		return fmt.Errorf("%s is larger than %d bytes", p, maxFileBytes)
	}
	return nil
}

// limitTransport fails the read of a response body larger than
// MaxResponseBytes (client-go reads a body whole).
type limitTransport struct{ rt http.RoundTripper }

func (t limitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil && resp.Body != nil && req.URL.Query().Get("watch") != "true" {
		resp.Body = &limitedBody{ReadCloser: resp.Body, left: MaxResponseBytes}
	}
	return resp, err
}

// limitedBody is a response body that fails after left bytes.
type limitedBody struct {
	io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One more byte tells a body of exactly the bound from a larger one.
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 {
			return 0, err
		}
		return 0, fmt.Errorf("the API server's response is larger than %d bytes", MaxResponseBytes)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
