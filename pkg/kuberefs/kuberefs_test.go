package kuberefs

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
)

// apiServer answers the list API as kube-apiserver does (limit and
// continue, a Status on refusal), with items objects per resource path,
// served two per page. Requests without the token are refused.
type apiServer struct {
	*httptest.Server
	items    map[string][]string // resource path -> object names ("ns/name" or "name")
	forbid   string              // a resource path answered 403
	loop     string              // a resource path whose continue token never ends
	requests atomic.Int64
}

func newAPIServer(t *testing.T, token string, items map[string][]string) *apiServer {
	a := &apiServer{items: items}
	a.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.requests.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"kind":"Status","message":"Unauthorized"}`)
			return
		}
		if r.URL.Path == a.forbid {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintf(w, `{"kind":"Status","message":"pods is forbidden: User \"x\" cannot list resource"}`)
			return
		}
		if r.URL.Query().Get("limit") == "" {
			t.Errorf("%s listed without a limit", r.URL.Path)
		}
		if r.URL.Path == a.loop {
			fmt.Fprint(w, `{"metadata":{"continue":"again"},"items":[]}`)
			return
		}
		names := a.items[r.URL.Path]
		start := 0
		fmt.Sscan(r.URL.Query().Get("continue"), &start)
		end := min(start+2, len(names))
		var objs []string
		for _, n := range names[start:end] {
			ns, name, ok := strings.Cut(n, "/")
			if !ok {
				ns, name = "", n
			}
			objs = append(objs, fmt.Sprintf(`{"metadata":{"namespace":%q,"name":%q},"spec":{"ref":"reg.example/team/vol@sha256:%064d"}}`, ns, name, start))
		}
		cont := ""
		if end < len(names) {
			cont = fmt.Sprint(end)
		}
		fmt.Fprintf(w, `{"metadata":{"continue":%q},"items":[%s]}`, cont, strings.Join(objs, ","))
	}))
	t.Cleanup(a.Close)
	return a
}

// writeKubeconfig writes a kubeconfig naming a's server under context ctx
// with user (YAML of the user's fields) and returns its path.
func writeKubeconfig(t *testing.T, dir, ctx, server string, caPEM []byte, user string) string {
	t.Helper()
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
current-context: %[1]s
clusters:
- name: c-%[1]s
  cluster:
    server: %[2]s
    certificate-authority-data: %[3]s
contexts:
- name: %[1]s
  context: {cluster: c-%[1]s, user: u-%[1]s}
users:
- name: u-%[1]s
  user:
%[4]s
`, ctx, server, base64.StdEncoding.EncodeToString(caPEM), user)
	p := filepath.Join(dir, ctx+".yaml")
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func serverCA(a *apiServer) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Certificate().Raw})
}

func collect(t *testing.T, c *Cluster) ([]string, error) {
	var names []string
	err := c.Objects(context.Background(), func(name string, obj []byte) error {
		if !json.Valid(obj) {
			t.Errorf("%s: not JSON: %s", name, obj)
		}
		names = append(names, name)
		return nil
	})
	sort.Strings(names)
	return names, err
}

// Every page of every resource is read, with the kubeconfig's CA and token,
// and each object is named by context, resource, namespace and name.
func TestObjectsReadsEveryPage(t *testing.T) {
	a := newAPIServer(t, "s3cret", map[string][]string{
		"/api/v1/pods":              {"ns1/p1", "ns1/p2", "ns2/p3", "ns2/p4", "ns2/p5"},
		"/api/v1/persistentvolumes": {"pv1"},
		"/apis/apps/v1/deployments": {"ns1/d1"},
	})
	dir := t.TempDir()
	t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "prod", a.URL, serverCA(a), "    token: s3cret"))
	c, err := Open("k8s://")
	if err != nil {
		t.Fatal(err)
	}
	if c.Name() != "k8s://prod" {
		t.Errorf("name %q, want k8s://prod", c.Name())
	}
	names, err := collect(t, c)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"k8s://prod/deployments/ns1/d1", "k8s://prod/persistentvolumes/pv1",
		"k8s://prod/pods/ns1/p1", "k8s://prod/pods/ns1/p2", "k8s://prod/pods/ns2/p3", "k8s://prod/pods/ns2/p4", "k8s://prod/pods/ns2/p5"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("objects:\n%v\nwant\n%v", names, want)
	}
	// 5 pods in pages of 2 are 3 requests; each other resource one.
	if n, w := a.requests.Load(), int64(3+len(Resources)-1); n != w {
		t.Errorf("%d requests, want %d", n, w)
	}
}

// A list the credentials cannot read fails the whole read (fail closed),
// with the server's reason and what bdnvol needs; the token is not in it.
func TestObjectsFailsClosed(t *testing.T) {
	a := newAPIServer(t, "s3cret", map[string][]string{"/api/v1/pods": {"ns/p"}})
	a.forbid = "/apis/batch/v1/cronjobs"
	t.Setenv("KUBECONFIG", writeKubeconfig(t, t.TempDir(), "prod", a.URL, serverCA(a), "    token: s3cret"))
	c, err := Open("k8s://prod")
	if err != nil {
		t.Fatal(err)
	}
	_, err = collect(t, c)
	if err == nil || !strings.Contains(err.Error(), "cronjobs") || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("got %v, want a forbidden error naming cronjobs", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error shows the token: %v", err)
	}

	t.Setenv("KUBECONFIG", writeKubeconfig(t, t.TempDir(), "prod", a.URL, serverCA(a), "    token: wrong"))
	c, err = Open("k8s://prod")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(t, c); err == nil || !strings.Contains(err.Error(), "unauthorized") || strings.Contains(err.Error(), "wrong") {
		t.Errorf("a refused token gave %v", err)
	}
}

// A server that hands back the same continue token is caught, not followed
// for ever.
func TestObjectsDetectsContinueLoop(t *testing.T) {
	a := newAPIServer(t, "t", nil)
	a.loop = "/api/v1/configmaps"
	t.Setenv("KUBECONFIG", writeKubeconfig(t, t.TempDir(), "x", a.URL, serverCA(a), "    token: t"))
	c, err := Open("k8s://")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(t, c); err == nil || !strings.Contains(err.Error(), "continue token") {
		t.Fatalf("got %v", err)
	}
	if n := a.requests.Load(); n > 4 {
		t.Errorf("%d requests for a looping list", n)
	}
}

// KUBECONFIG's files merge first-wins, as kubectl's do; a context of the
// second file is reachable by name; the server's CA is required (no CA: the
// TLS handshake fails).
func TestKubeconfigMergeAndTLS(t *testing.T) {
	a := newAPIServer(t, "tok-b", map[string][]string{"/api/v1/pods": {"ns/p"}})
	dir := t.TempDir()
	first := writeKubeconfig(t, dir, "a", "https://127.0.0.1:1", serverCA(a), "    token: tok-a")
	second := writeKubeconfig(t, dir, "b", a.URL, serverCA(a), "    tokenFile: b.token")
	os.WriteFile(filepath.Join(dir, "b.token"), []byte("tok-b\n"), 0o600) // relative to the kubeconfig
	t.Setenv("KUBECONFIG", first+string(os.PathListSeparator)+second+string(os.PathListSeparator)+filepath.Join(dir, "missing"))
	c, err := Open("k8s://")
	if err != nil || c.Name() != "k8s://a" {
		t.Fatalf("current context: %v, %v", c, err)
	}
	c, err = Open("k8s://b")
	if err != nil {
		t.Fatal(err)
	}
	if names, err := collect(t, c); err != nil || len(names) != 1 {
		t.Fatalf("context b: %v %v", names, err)
	}
	if _, err := Open("k8s://nope"); err == nil || !strings.Contains(err.Error(), `no context "nope"`) {
		t.Errorf("unknown context: %v", err)
	}

	noCA := strings.Replace(string(must(os.ReadFile(second))), "certificate-authority-data", "x-unused", 1)
	os.WriteFile(second, []byte(noCA), 0o600)
	t.Setenv("KUBECONFIG", second)
	c, err = Open("k8s://b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(t, c); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a server with no trusted CA was read: %v", err)
	}
}

// A credential plugin is run as kubectl runs it and its token is used; its
// stderr is not shown. auth-provider is refused with a clear error.
func TestKubeconfigExecAndAuthProvider(t *testing.T) {
	a := newAPIServer(t, "from-plugin", map[string][]string{"/api/v1/pods": {"ns/p"}})
	dir := t.TempDir()
	plugin := filepath.Join(dir, "plugin.sh")
	script := "#!/bin/sh\necho secret-prompt >&2\n" +
		`printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}' "$PLUGIN_TOKEN"` + "\n"
	if err := os.WriteFile(plugin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	user := fmt.Sprintf("    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: %s\n      env:\n      - {name: PLUGIN_TOKEN, value: from-plugin}", plugin)
	t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "e", a.URL, serverCA(a), user))
	c, err := Open("k8s://")
	if err != nil {
		t.Fatal(err)
	}
	if names, err := collect(t, c); err != nil || len(names) != 1 {
		t.Fatalf("exec plugin: %v %v", names, err)
	}

	t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "g", a.URL, serverCA(a), "    auth-provider: {name: gcp}"))
	if _, err := Open("k8s://"); err == nil || !strings.Contains(err.Error(), "auth-provider") {
		t.Errorf("auth-provider: %v", err)
	}
}

// With no kubeconfig, k8s:// is the pod's own cluster; outside a pod it is
// a clear error, and a named context needs a kubeconfig.
func TestInClusterOrClearError(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := Open("k8s://"); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Errorf("outside a pod: %v", err)
	}
	if _, err := Open("k8s://prod"); err == nil || !strings.Contains(err.Error(), "no kubeconfig") {
		t.Errorf("named context without kubeconfig: %v", err)
	}

	a := newAPIServer(t, "sa-token", map[string][]string{"/api/v1/pods": {"ns/p"}})
	sa := t.TempDir()
	os.WriteFile(filepath.Join(sa, "ca.crt"), serverCA(a), 0o600)
	os.WriteFile(filepath.Join(sa, "token"), []byte("sa-token"), 0o600)
	old := serviceAccountDir
	serviceAccountDir = sa
	t.Cleanup(func() { serviceAccountDir = old })
	host, port, _ := strings.Cut(strings.TrimPrefix(a.URL, "https://"), ":")
	t.Setenv("KUBERNETES_SERVICE_HOST", host)
	t.Setenv("KUBERNETES_SERVICE_PORT", port)
	c, err := Open("k8s://")
	if err != nil {
		t.Fatal(err)
	}
	if names, err := collect(t, c); err != nil || len(names) != 1 || c.Name() != "k8s://in-cluster" {
		t.Fatalf("in-cluster: %v %v %s", names, err, c.Name())
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
