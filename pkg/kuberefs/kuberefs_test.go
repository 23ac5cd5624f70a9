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
	"syscall"
	"testing"
	"time"
)

// apiServer answers the list API in kube-apiserver's wire format (limit
// and continue, typed lists, a Status on refusal), with items objects per
// resource path, served two per page. Requests without the token are
// refused.
type apiServer struct {
	*httptest.Server
	items    map[string][]string // resource path -> object names ("ns/name" or "name")
	forbid   string              // a resource path answered 403
	loop     string              // a resource path whose continue token never changes
	fresh    string              // a resource path with a fresh continue token on every page
	raw      map[string]string   // a resource path -> the body answered (200) instead of its list
	busy     string              // a resource path answered 429 with a Retry-After of an hour
	long     string              // a resource path whose continue token is 9,000 bytes
	requests atomic.Int64
}

func newAPIServer(t *testing.T, token string, items map[string][]string) *apiServer {
	a := &apiServer{items: items, raw: map[string]string{}}
	byPath := map[string]resource{}
	for _, r := range resources {
		byPath[r.path()] = r
	}
	status := func(w http.ResponseWriter, code int, reason, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"reason":%q,"code":%d}`, msg, reason, code)
	}
	a.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := a.requests.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+token {
			status(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
			return
		}
		res, ok := byPath[r.URL.Path]
		if !ok {
			status(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
			return
		}
		if r.URL.Path == a.forbid {
			status(w, http.StatusForbidden, "Forbidden", res.gvr.Resource+` is forbidden: User "x" cannot list resource`)
			return
		}
		if r.URL.Path == a.busy {
			w.Header().Set("Retry-After", "3600")
			status(w, http.StatusTooManyRequests, "TooManyRequests", "come back in an hour")
			return
		}
		if r.URL.Query().Get("limit") == "" {
			t.Errorf("%s listed without a limit", r.URL.Path)
		}
		w.Header().Set("Content-Type", "application/json")
		if body, ok := a.raw[r.URL.Path]; ok {
			fmt.Fprint(w, body)
			return
		}
		list := func(cont, items string) {
			fmt.Fprintf(w, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"7","continue":%q},"items":[%s]}`,
				res.listKind, res.gvr.GroupVersion().String(), cont, items)
		}
		switch r.URL.Path {
		case a.loop:
			list("again", "")
			return
		case a.fresh:
			list(fmt.Sprint("fresh-", n), "")
			return
		case a.long:
			list(fmt.Sprint(n, strings.Repeat("x", 9000)), "")
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
		list(cont, strings.Join(objs, ","))
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
	c, err := Open(context.Background(), "k8s://")
	if err != nil {
		t.Fatal(err)
	}
	if c.Name() != "k8s://prod" {
		t.Errorf("name %q, want k8s://prod", c.Name())
	}
	var refs []string
	err = c.Objects(context.Background(), func(name string, obj []byte) error {
		if strings.HasPrefix(name, "k8s://prod/pods/ns2/p5") {
			var o struct {
				Spec struct{ Ref string } `json:"spec"`
			}
			json.Unmarshal(obj, &o)
			refs = append(refs, o.Spec.Ref)
		}
		return nil
	})
	if err != nil || len(refs) != 1 || !strings.HasPrefix(refs[0], "reg.example/team/vol@sha256:") {
		t.Fatalf("the object's JSON lost its fields: %v %v", refs, err)
	}
	a.requests.Store(0)
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
	if n, w := a.requests.Load(), int64(3+len(resources)-1); n != w {
		t.Errorf("%d requests, want %d", n, w)
	}
}

// A list the credentials cannot read fails the whole read (fail closed),
// with the server's reason and what bdnvol needs; the token is not in it.
func TestObjectsFailsClosed(t *testing.T) {
	a := newAPIServer(t, "s3cret", map[string][]string{"/api/v1/pods": {"ns/p"}})
	a.forbid = "/apis/batch/v1/cronjobs"
	t.Setenv("KUBECONFIG", writeKubeconfig(t, t.TempDir(), "prod", a.URL, serverCA(a), "    token: s3cret"))
	c, err := Open(context.Background(), "k8s://prod")
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
	c, err = Open(context.Background(), "k8s://prod")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(t, c); err == nil || !strings.Contains(err.Error(), "unauthorized") || strings.Contains(err.Error(), "wrong") {
		t.Errorf("a refused token gave %v", err)
	}
}

// A 200 answer that is not a list of the kind asked for fails the read: an
// empty object or a Status (as a proxy or an aggregated API may send) must
// not read as "no pods", which would let gc delete the versions they run.
func TestObjectsRefusesAnAnswerThatIsNotTheList(t *testing.T) {
	for _, body := range []string{
		`{}`,
		`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","code":200}`,
		`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"upstream gone","code":200}`,
		`{"kind":"PodList","apiVersion":"v1","metadata":{}}`,
		`{"apiVersion":"v1","metadata":{},"items":[]}`,
		`{"kind":"DeploymentList","apiVersion":"apps/v1","metadata":{},"items":[]}`,
		`{"kind":"PodList","apiVersion":"v2","metadata":{},"items":[]}`,
		`[]`,
		`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":{}}`,
		`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":null}`,
	} {
		a := newAPIServer(t, "t", map[string][]string{"/api/v1/configmaps": {"ns/warm"}})
		a.raw["/api/v1/pods"] = body
		t.Setenv("KUBECONFIG", writeKubeconfig(t, t.TempDir(), "x", a.URL, serverCA(a), "    token: t"))
		c, err := Open(context.Background(), "k8s://")
		if err != nil {
			t.Fatal(err)
		}
		names, err := collect(t, c)
		if err == nil || !strings.Contains(err.Error(), "listing pods") {
			t.Errorf("a 200 answer %s read as %v, %v; want a failed read naming pods", body, names, err)
		}
	}
}

// A server that hands back the same continue token is caught, not followed
// for ever.
func TestObjectsDetectsContinueLoop(t *testing.T) {
	a := newAPIServer(t, "t", nil)
	a.loop = "/api/v1/configmaps"
	t.Setenv("KUBECONFIG", writeKubeconfig(t, t.TempDir(), "x", a.URL, serverCA(a), "    token: t"))
	c, err := Open(context.Background(), "k8s://")
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

// A server that hands back a fresh continue token on every page is followed
// for 200 pages of one kind, then the read fails.
func TestObjectsBoundsFreshContinueTokens(t *testing.T) {
	a := newAPIServer(t, "t", nil)
	a.fresh = "/api/v1/persistentvolumes"
	t.Setenv("KUBECONFIG", writeKubeconfig(t, t.TempDir(), "x", a.URL, serverCA(a), "    token: t"))
	c, err := Open(context.Background(), "k8s://")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(t, c); err == nil || !strings.Contains(err.Error(), "persistentvolumes") || !strings.Contains(err.Error(), "pages") {
		t.Fatalf("got %v, want too many pages of persistentvolumes", err)
	}
	// pods (1 page), then 200 pages of persistent volumes (100,000
	// objects of one kind at 500 a page) and no more.
	if n, w := a.requests.Load(), int64(1+200); n != w {
		t.Errorf("%d requests, want %d", n, w)
	}
}

// A continue token longer than kube-apiserver's ever are fails the read
// before it is sent back.
func TestObjectsRefusesLongContinueToken(t *testing.T) {
	a := newAPIServer(t, "t", nil)
	a.long = "/api/v1/pods"
	t.Setenv("KUBECONFIG", writeKubeconfig(t, t.TempDir(), "x", a.URL, serverCA(a), "    token: t"))
	c, err := Open(context.Background(), "k8s://")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(t, c); err == nil || !strings.Contains(err.Error(), "continue token is longer") {
		t.Fatalf("got %v", err)
	}
	if n := a.requests.Load(); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

// A server that answers 429 with a Retry-After of an hour is not waited
// on beyond pageTimeout: the read fails.
func TestObjectsBoundsRetryAfter(t *testing.T) {
	old := pageTimeout
	pageTimeout = time.Second
	t.Cleanup(func() { pageTimeout = old })
	a := newAPIServer(t, "t", nil)
	a.busy = "/apis/apps/v1/deployments"
	t.Setenv("KUBECONFIG", writeKubeconfig(t, t.TempDir(), "x", a.URL, serverCA(a), "    token: t"))
	c, err := Open(context.Background(), "k8s://")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(t, c); err == nil || !strings.Contains(err.Error(), "deployments") {
		t.Fatalf("got %v, want a failed read of deployments", err)
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
	c, err := Open(context.Background(), "k8s://")
	if err != nil || c.Name() != "k8s://a" {
		t.Fatalf("current context: %v, %v", c, err)
	}
	c, err = Open(context.Background(), "k8s://b")
	if err != nil {
		t.Fatal(err)
	}
	if names, err := collect(t, c); err != nil || len(names) != 1 {
		t.Fatalf("context b: %v %v", names, err)
	}
	if _, err := Open(context.Background(), "k8s://nope"); err == nil || !strings.Contains(err.Error(), `no context "nope"`) {
		t.Errorf("unknown context: %v", err)
	}

	noCA := strings.Replace(string(must(os.ReadFile(second))), "certificate-authority-data", "x-unused", 1)
	os.WriteFile(second, []byte(noCA), 0o600)
	t.Setenv("KUBECONFIG", second)
	c, err = Open(context.Background(), "k8s://b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(t, c); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a server with no trusted CA was read: %v", err)
	}
}

// A token file, CA file or kubeconfig that is a FIFO is refused with a
// clear error; it is not opened for reading, which would block for ever.
func TestKubeconfigRefusesFIFOs(t *testing.T) {
	a := newAPIServer(t, "t", nil)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	caFile := strings.Replace(string(must(os.ReadFile(writeKubeconfig(t, dir, "ca", a.URL, serverCA(a), "    token: t")))),
		"certificate-authority-data: ", "certificate-authority: fifo\n    x-unused: ", 1)
	os.WriteFile(filepath.Join(dir, "ca.yaml"), []byte(caFile), 0o600)
	for _, kc := range []string{
		writeKubeconfig(t, dir, "token", a.URL, serverCA(a), "    tokenFile: fifo"),
		filepath.Join(dir, "ca.yaml"),
		writeKubeconfig(t, dir, "key", a.URL, serverCA(a), "    client-certificate: fifo\n    client-key: fifo"),
		fifo,
	} {
		t.Setenv("KUBECONFIG", kc)
		_, err := Open(context.Background(), "k8s://")
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("%s: got %v, want a FIFO refused", filepath.Base(kc), err)
		}
	}
}

// A credential plugin is run as kubectl runs it and its token is used; its
// stderr is not shown. A plugin that exits but leaves a child holding its
// standard output does not hang the read. auth-provider is refused with a
// clear error.
func TestKubeconfigExecAndAuthProvider(t *testing.T) {
	a := newAPIServer(t, "from-plugin", map[string][]string{"/api/v1/pods": {"ns/p"}})
	dir := t.TempDir()
	plugin := filepath.Join(dir, "plugin.sh")
	script := "#!/bin/sh\necho secret-prompt >&2\n" +
		`printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}' "$PLUGIN_TOKEN"` + "\n" +
		// A child left behind with the plugin's standard output, as a
		// token-cache daemon a plugin starts would be.
		`if [ -n "$CHILD_PID" ]; then sleep 3600 & echo $! > "$CHILD_PID"; fi` + "\n"
	if err := os.WriteFile(plugin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, child := range []bool{false, true} {
		user := fmt.Sprintf("    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      interactiveMode: Never\n      command: %s\n      env:\n      - {name: PLUGIN_TOKEN, value: from-plugin}", plugin)
		if child {
			pidFile := filepath.Join(dir, "child.pid")
			user += fmt.Sprintf("\n      - {name: CHILD_PID, value: %s}", pidFile)
			t.Cleanup(func() {
				var pid int
				if _, err := fmt.Sscan(string(must(os.ReadFile(pidFile))), &pid); err == nil && pid > 0 {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			})
		}
		t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "e", a.URL, serverCA(a), user))
		c, err := Open(context.Background(), "k8s://")
		if err != nil {
			t.Fatalf("child %v: %v", child, err)
		}
		if names, err := collect(t, c); err != nil || len(names) != 1 {
			t.Fatalf("exec plugin (child %v): %v %v", child, names, err)
		}
	}

	t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "g", a.URL, serverCA(a), "    auth-provider: {name: gcp}"))
	if _, err := Open(context.Background(), "k8s://"); err == nil || !strings.Contains(err.Error(), "auth-provider") {
		t.Errorf("auth-provider: %v", err)
	}
}

// With no kubeconfig, k8s:// outside a pod is a clear error, and a named
// context needs a kubeconfig. (kubeclient's tests read a pod's own cluster.)
func TestNoKubeconfigClearError(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := Open(context.Background(), "k8s://"); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Errorf("outside a pod: %v", err)
	}
	if _, err := Open(context.Background(), "k8s://prod"); err == nil || !strings.Contains(err.Error(), "no kubeconfig") {
		t.Errorf("named context without kubeconfig: %v", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
