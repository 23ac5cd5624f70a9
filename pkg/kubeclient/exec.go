package kubeclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/pkg/apis/clientauthentication"
	"k8s.io/client-go/pkg/apis/clientauthentication/install"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Bounds of a credential plugin: how long one run may take, how long its
// output is waited for once it has exited, and the size of its output.
const (
	execTimeout   = time.Minute
	execWaitDelay = 2 * time.Second
	maxExecOutput = 4 << 20
)

// execScheme decodes and encodes the ExecCredential wire format with
// client-go's own types (client.authentication.k8s.io v1 and v1beta1).
var (
	execScheme = runtime.NewScheme()
	execCodecs = serializer.NewCodecFactory(execScheme)
)

func init() { install.Install(execScheme) }

// execPlugin is a kubeconfig's credential plugin, run by the ExecCredential
// protocol client-go's exec authenticator speaks, never interactively, with
// the bounds above: client-go's runs it with no deadline and waits for
// every process that holds its standard output, so a plugin that leaves a
// child behind hangs the command.
type execPlugin struct {
	cfg     clientcmdapi.ExecConfig
	gv      schema.GroupVersion
	cluster *clientauthentication.Cluster // when the plugin asks for it

	mu     sync.Mutex
	token  string
	expiry time.Time // zero: until refused
}

// useExecPlugin runs cfg's credential plugin once and sets what it returns
// on cfg in client-go's place: a client certificate as the TLS client
// certificate, a token through a transport that runs the plugin again when
// the token expires or is refused.
func useExecPlugin(ctx context.Context, cfg *rest.Config) error {
	ex := cfg.ExecProvider
	gv, err := schema.ParseGroupVersion(ex.APIVersion)
	if err != nil || !execScheme.IsVersionRegistered(gv) {
		return fmt.Errorf("credential plugin %s: apiVersion %q is not one of client.authentication.k8s.io/v1, v1beta1", ex.Command, ex.APIVersion)
	}
	if ex.InteractiveMode == clientcmdapi.AlwaysExecInteractiveMode {
		return fmt.Errorf("credential plugin %s: it needs a terminal (interactiveMode: Always), which bdnvol does not give it", ex.Command)
	}
	p := &execPlugin{cfg: *ex, gv: gv}
	if ex.ProvideClusterInfo {
		if p.cluster, err = rest.ConfigToExecCluster(cfg); err != nil {
			return err
		}
	}
	st, err := p.run(ctx)
	if err != nil {
		return err
	}
	cfg.ExecProvider = nil
	if st.ClientCertificateData != "" {
		cfg.TLSClientConfig.CertData = []byte(st.ClientCertificateData)
		cfg.TLSClientConfig.KeyData = []byte(st.ClientKeyData)
	}
	if st.Token != "" {
		p.set(st)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &execTransport{p: p, rt: rt} })
	}
	return nil
}

func (p *execPlugin) set(st *clientauthentication.ExecCredentialStatus) {
	p.token, p.expiry = st.Token, time.Time{}
	if st.ExpirationTimestamp != nil {
		p.expiry = st.ExpirationTimestamp.Time
	}
}

// tokenFor returns the plugin's token, running the plugin again when the
// token has expired.
func (p *execPlugin) tokenFor(ctx context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.token != "" && (p.expiry.IsZero() || time.Now().Before(p.expiry)) {
		return p.token, nil
	}
	st, err := p.run(ctx)
	if err != nil {
		return "", err
	}
	if st.Token == "" {
		return "", fmt.Errorf("credential plugin %s: it returned no token", p.cfg.Command)
	}
	p.set(st)
	return p.token, nil
}

// refused forgets tok after the server refused it.
func (p *execPlugin) refused(tok string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.token == tok {
		p.token = ""
	}
}

// run runs the plugin once and returns the credential it prints.
func (p *execPlugin) run(ctx context.Context) (*clientauthentication.ExecCredentialStatus, error) {
	name := p.cfg.Command
	info, err := runtime.Encode(execCodecs.LegacyCodec(p.gv), &clientauthentication.ExecCredential{
		Spec: clientauthentication.ExecCredentialSpec{Interactive: false, Cluster: p.cluster},
	})
	if err != nil {
		return nil, fmt.Errorf("credential plugin %s: %v", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, p.cfg.Args...)
	cmd.Env = os.Environ()
	for _, e := range p.cfg.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Env = append(cmd.Env, "KUBERNETES_EXEC_INFO="+string(info))
	out := &limitedBuffer{max: maxExecOutput}
	cmd.Stdout = out
	cmd.Stderr = io.Discard // a plugin may print secrets or prompts: never echoed
	// Once the plugin has exited, its output is not waited for beyond
	// execWaitDelay: a child it left behind may hold standard output open.
	cmd.WaitDelay = execWaitDelay
	err = cmd.Run()
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, fmt.Errorf("credential plugin %s: it did not finish within %s", name, execTimeout)
	case ctx.Err() != nil:
		return nil, fmt.Errorf("credential plugin %s: %w", name, ctx.Err())
	case errors.Is(err, exec.ErrWaitDelay):
		// It exited with success; what it printed before is its answer.
	case errors.Is(err, exec.ErrNotFound) && p.cfg.InstallHint != "":
		return nil, fmt.Errorf("credential plugin %s: %v\n%s", name, err, p.cfg.InstallHint)
	case err != nil:
		return nil, fmt.Errorf("credential plugin %s: %v", name, err)
	}
	cred := &clientauthentication.ExecCredential{}
	_, gvk, err := execCodecs.UniversalDecoder(p.gv).Decode(out.Bytes(), nil, cred)
	if err != nil {
		return nil, fmt.Errorf("credential plugin %s: its output is not an ExecCredential: %v", name, err)
	}
	if gvk.GroupVersion() != p.gv {
		return nil, fmt.Errorf("credential plugin %s: it answered %s, configured for %s", name, gvk.GroupVersion(), p.gv)
	}
	st := cred.Status
	switch {
	case st == nil || st.Token == "" && st.ClientCertificateData == "":
		return nil, fmt.Errorf("credential plugin %s: its output is an ExecCredential with no token or client certificate", name)
	case (st.ClientCertificateData == "") != (st.ClientKeyData == ""):
		return nil, fmt.Errorf("credential plugin %s: it returned a client certificate without its key, or a key alone", name)
	}
	return st, nil
}

// execTransport sets the plugin's token on each request that has no
// credentials of its own, and forgets a token the server refuses.
type execTransport struct {
	p  *execPlugin
	rt http.RoundTripper
}

func (t *execTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Authorization") != "" {
		return t.rt.RoundTrip(req)
	}
	tok, err := t.p.tokenFor(req.Context())
	if err != nil {
		return nil, err
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := t.rt.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		t.p.refused(tok)
	}
	return resp, err
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
