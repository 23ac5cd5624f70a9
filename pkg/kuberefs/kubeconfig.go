package kuberefs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// kubeconfig is the part of a kubeconfig file that reaching a cluster needs.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string      `yaml:"name"`
		Cluster clusterInfo `yaml:"cluster"`
	} `yaml:"clusters"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
	Users []struct {
		Name string   `yaml:"name"`
		User userInfo `yaml:"user"`
	} `yaml:"users"`
}

type clusterInfo struct {
	Server        string `yaml:"server"`
	CA            string `yaml:"certificate-authority"`
	CAData        string `yaml:"certificate-authority-data"`
	Insecure      bool   `yaml:"insecure-skip-tls-verify"`
	TLSServerName string `yaml:"tls-server-name"`
	dir           string // the kubeconfig's directory, for relative paths
}

type userInfo struct {
	Token          string      `yaml:"token"`
	TokenFile      string      `yaml:"tokenFile"`
	ClientCert     string      `yaml:"client-certificate"`
	ClientCertData string      `yaml:"client-certificate-data"`
	ClientKey      string      `yaml:"client-key"`
	ClientKeyData  string      `yaml:"client-key-data"`
	Username       string      `yaml:"username"`
	Password       string      `yaml:"password"`
	Exec           *execConfig `yaml:"exec"`
	AuthProvider   any         `yaml:"auth-provider"`
	dir            string
}

// execConfig is a credential plugin, run as kubectl runs it.
type execConfig struct {
	Command    string   `yaml:"command"`
	Args       []string `yaml:"args"`
	APIVersion string   `yaml:"apiVersion"`
	Env        []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
}

// endpoint is how to reach one cluster as one user.
type endpoint struct {
	name   string // the context, or "in-cluster"
	server *url.URL
	tls    *tls.Config
	token  func(context.Context) (string, error) // "" for none
	basic  [2]string
}

// maxConfigBytes bounds a kubeconfig file, a token file and a credential
// plugin's output.
const maxConfigBytes = 4 << 20

// Service account paths of a pod, which in-cluster access reads.
var (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// kubeconfigPaths are the files KUBECONFIG names, else ~/.kube/config.
func kubeconfigPaths() []string {
	if v := os.Getenv("KUBECONFIG"); v != "" {
		var out []string
		for _, p := range filepath.SplitList(v) {
			if p != "" {
				out = append(out, p)
			}
		}
		return out
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return nil
	}
	return []string{filepath.Join(home, ".kube", "config")}
}

// loadKubeconfig merges the kubeconfig files that exist among paths as
// kubectl does: the first file to name a cluster, context or user, or to
// set the current context, wins. found is false when none exists.
func loadKubeconfig(paths []string) (kc kubeconfig, found bool, err error) {
	for _, p := range paths {
		b, err := readBounded(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return kc, false, fmt.Errorf("kubeconfig %s: %w", p, err)
		}
		var one kubeconfig
		if err := yaml.Unmarshal(b, &one); err != nil {
			return kc, false, fmt.Errorf("kubeconfig %s: not a kubeconfig: %v", p, err)
		}
		found = true
		dir := filepath.Dir(p)
		if kc.CurrentContext == "" {
			kc.CurrentContext = one.CurrentContext
		}
		for _, c := range one.Clusters {
			if !hasName(len(kc.Clusters), func(i int) string { return kc.Clusters[i].Name }, c.Name) {
				c.Cluster.dir = dir
				kc.Clusters = append(kc.Clusters, c)
			}
		}
		for _, c := range one.Contexts {
			if !hasName(len(kc.Contexts), func(i int) string { return kc.Contexts[i].Name }, c.Name) {
				kc.Contexts = append(kc.Contexts, c)
			}
		}
		for _, u := range one.Users {
			if !hasName(len(kc.Users), func(i int) string { return kc.Users[i].Name }, u.Name) {
				u.User.dir = dir
				kc.Users = append(kc.Users, u)
			}
		}
	}
	return kc, found, nil
}

func hasName(n int, name func(int) string, want string) bool {
	for i := 0; i < n; i++ {
		if name(i) == want {
			return true
		}
	}
	return false
}

// fromKubeconfig is the endpoint of context name (the current one when
// empty) in kc.
func fromKubeconfig(kc kubeconfig, name string) (*endpoint, error) {
	if name == "" {
		name = kc.CurrentContext
	}
	if name == "" {
		return nil, errors.New("kubeconfig: no current context; name one: k8s://CONTEXT")
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == name {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
			break
		}
	}
	if !found {
		return nil, fmt.Errorf("kubeconfig: no context %q", name)
	}
	var ci *clusterInfo
	for i := range kc.Clusters {
		if kc.Clusters[i].Name == clusterName {
			ci = &kc.Clusters[i].Cluster
		}
	}
	if ci == nil {
		return nil, fmt.Errorf("kubeconfig: context %q names cluster %q, which is not there", name, clusterName)
	}
	var ui userInfo
	for _, u := range kc.Users {
		if u.Name == userName {
			ui = u.User
		}
	}
	ep, err := clusterEndpoint(name, *ci)
	if err != nil {
		return nil, err
	}
	if err := ep.addUser(ui); err != nil {
		return nil, fmt.Errorf("kubeconfig: context %q, user %q: %w", name, userName, err)
	}
	return ep, nil
}

func clusterEndpoint(name string, ci clusterInfo) (*endpoint, error) {
	u, err := url.Parse(ci.Server)
	if err != nil || u.Host == "" || u.Scheme != "https" && u.Scheme != "http" {
		return nil, fmt.Errorf("kubeconfig: context %q: server %q is not an http(s) URL", name, ci.Server)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: ci.TLSServerName, InsecureSkipVerify: ci.Insecure}
	var ca []byte
	switch {
	case ci.CAData != "":
		if ca, err = base64.StdEncoding.DecodeString(ci.CAData); err != nil {
			return nil, fmt.Errorf("kubeconfig: context %q: certificate-authority-data is not base64", name)
		}
	case ci.CA != "":
		if ca, err = readBounded(rel(ci.dir, ci.CA)); err != nil {
			return nil, fmt.Errorf("kubeconfig: context %q: certificate-authority: %w", name, err)
		}
	}
	if ca != nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("kubeconfig: context %q: no certificate in its certificate authority", name)
		}
		cfg.RootCAs = pool
	}
	return &endpoint{name: name, server: u, tls: cfg}, nil
}

// addUser sets the credentials of ui on ep.
func (ep *endpoint) addUser(ui userInfo) error {
	switch {
	case ui.AuthProvider != nil:
		return errors.New("auth-provider credentials are not supported; use a token or an exec plugin")
	case ui.Exec != nil:
		ex := *ui.Exec
		ep.token = func(ctx context.Context) (string, error) { return runExec(ctx, ex, ep) }
	case ui.Token != "":
		tok := ui.Token
		ep.token = func(context.Context) (string, error) { return tok, nil }
	case ui.TokenFile != "":
		p := rel(ui.dir, ui.TokenFile)
		ep.token = func(context.Context) (string, error) { return readToken(p) }
	case ui.Username != "":
		ep.basic = [2]string{ui.Username, ui.Password}
	}
	cert, key, err := pemPair(ui.dir, ui.ClientCert, ui.ClientCertData, ui.ClientKey, ui.ClientKeyData)
	if err != nil || cert == nil {
		return err
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return fmt.Errorf("client certificate: %v", err)
	}
	ep.tls.Certificates = []tls.Certificate{pair}
	return nil
}

// pemPair returns the client certificate and key, from data or files.
func pemPair(dir, certFile, certData, keyFile, keyData string) (cert, key []byte, err error) {
	load := func(what, file, data string) ([]byte, error) {
		if data != "" {
			b, err := base64.StdEncoding.DecodeString(data)
			if err != nil {
				return nil, fmt.Errorf("%s-data is not base64", what)
			}
			return b, nil
		}
		if file == "" {
			return nil, nil
		}
		b, err := readBounded(rel(dir, file))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		return b, nil
	}
	if cert, err = load("client-certificate", certFile, certData); err != nil {
		return nil, nil, err
	}
	if key, err = load("client-key", keyFile, keyData); err != nil {
		return nil, nil, err
	}
	if (cert == nil) != (key == nil) {
		return nil, nil, errors.New("a client certificate needs both a certificate and a key")
	}
	return cert, key, nil
}

// inCluster is the endpoint of the pod's own cluster, through its service
// account.
func inCluster() (*endpoint, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("no kubeconfig (KUBECONFIG or ~/.kube/config) and not in a pod (KUBERNETES_SERVICE_HOST is not set)")
	}
	ca, err := readBounded(filepath.Join(serviceAccountDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("in-cluster: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("in-cluster: no certificate in the service account's ca.crt")
	}
	u := &url.URL{Scheme: "https", Host: joinHostPort(host, port)}
	tokenPath := filepath.Join(serviceAccountDir, "token")
	return &endpoint{name: "in-cluster", server: u, tls: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool},
		// Re-read at each request: the kubelet rotates projected tokens.
		token: func(context.Context) (string, error) { return readToken(tokenPath) }}, nil
}

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// runExec runs a credential plugin and returns the token it prints (a
// client certificate it prints is set on ep).
func runExec(ctx context.Context, ex execConfig, ep *endpoint) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ex.Command, ex.Args...)
	cmd.Env = os.Environ()
	for _, e := range ex.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	api := ex.APIVersion
	if api == "" {
		api = "client.authentication.k8s.io/v1"
	}
	info, _ := json.Marshal(map[string]any{"apiVersion": api, "kind": "ExecCredential", "spec": map[string]any{"interactive": false}})
	cmd.Env = append(cmd.Env, "KUBERNETES_EXEC_INFO="+string(info))
	var out limitedBuffer
	out.max = maxConfigBytes
	cmd.Stdout = &out
	cmd.Stderr = io.Discard // a plugin may print secrets or prompts: never echoed
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("credential plugin %s: %v", ex.Command, err)
	}
	var cred struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out.Bytes(), &cred); err != nil || cred.Status.Token == "" {
		return "", fmt.Errorf("credential plugin %s: its output is not an ExecCredential with a token", ex.Command)
	}
	return cred.Status.Token, nil
}

// limitedBuffer is a buffer that fails writes beyond max bytes.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, fmt.Errorf("more than %d bytes", b.max)
	}
	return b.Buffer.Write(p)
}

func readToken(p string) (string, error) {
	b, err := readBounded(p)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// readBounded reads a regular file of at most maxConfigBytes.
func readBounded(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", p, maxConfigBytes)
	}
	return b, nil
}

// rel resolves p against dir, as kubectl resolves a kubeconfig's paths.
func rel(dir, p string) string {
	if filepath.IsAbs(p) || dir == "" {
		return p
	}
	return filepath.Join(dir, p)
}
