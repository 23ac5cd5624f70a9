package e2e

import (
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestClusterRefs runs gc and rm with --refs k8s:// against a real API
// server: a Deployment scaled to zero (it would mount its version on the next
// rollout), a pod that cannot be scheduled and a PersistentVolume keep the
// versions they name, and nothing else does; once the Deployment is
// deleted its version may go. A kubeconfig the server refuses fails the
// plan: nothing is planned from part of the cluster.
func TestClusterRefs(t *testing.T) {
	requireCluster(t)
	c := startCluster(t)
	reg := newDistribution(t)
	repo := reg.Host + "/team/refs"
	var d [5]string
	for i := range d {
		src := t.TempDir()
		os.WriteFile(filepath.Join(src, "v.txt"), []byte(fmt.Sprintf("version %d\n", i)), 0o644)
		d[i] = pushJSON(t, repo+fmt.Sprintf(":v%d", i), src).Digest
	}
	// d[0] by a Deployment at zero replicas, d[1] by a pod no node can
	// take, d[2] by a PersistentVolume through its tag; d[3] by nothing;
	// d[4] is the newest, which --keep-last 1 keeps.
	c.apply(fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: keeper, namespace: default}
spec:
  replicas: 0
  selector: {matchLabels: {app: keeper}}
  template:
    metadata: {labels: {app: keeper}}
    spec:
      containers: [{name: c, image: %[1]s, command: [sleep, "1"]}]
      volumes:
        - name: data
          csi: {driver: %[2]s, readOnly: true, volumeAttributes: {ref: %[3]q}}
---
apiVersion: v1
kind: Pod
metadata: {name: unschedulable, namespace: default}
spec:
  nodeSelector: {no-such-label: "x"}
  containers: [{name: c, image: %[1]s, command: [sleep, "1"]}]
  volumes:
    - name: data
      csi: {driver: %[2]s, readOnly: true, volumeAttributes: {ref: %[4]q}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: weights-v2}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadOnlyMany]
  csi: {driver: %[2]s, volumeHandle: weights-v2, readOnly: true, volumeAttributes: {ref: %[5]q}}
`, imgBusybox, driverName, repo+"@"+d[0], repo+"@"+d[1], repo+":v2"))

	env := []string{"KUBECONFIG=" + c.kubeconfig}
	plan := func(refs ...string) (map[string]gcDecision, result) {
		t.Helper()
		args := []string{"gc", repo, "--keep-last", "1", "--keep-tag", "no-such-tag", "--json"}
		for _, r := range refs {
			args = append(args, "--refs", r)
		}
		res := runWith(t, "", env, args...)
		if res.code != 0 {
			return nil, res
		}
		var g gcJSON
		mustJSON(t, []byte(res.stdout), &g)
		out := map[string]gcDecision{}
		for _, v := range g.Plan.Versions {
			out[v.Digest] = v
		}
		return out, res
	}
	why := func(v gcDecision) string {
		var s []string
		for _, r := range v.Reasons {
			s = append(s, r.Text)
		}
		return strings.Join(s, "; ")
	}

	// Without the cluster, only the newest is kept: the test can fail.
	p, res := plan()
	if p == nil {
		t.Fatalf("gc without --refs failed:\n%s", res)
	}
	for i := 0; i < 4; i++ {
		if p[d[i]].Action != "delete" {
			t.Fatalf("without --refs v%d is %q, want delete:\n%s", i, p[d[i]].Action, res)
		}
	}

	p, res = plan("k8s://")
	if p == nil {
		t.Fatalf("gc --refs k8s:// failed:\n%s", res)
	}
	for i, want := range []string{"k8s://e2e/deployments/default/keeper", "k8s://e2e/pods/default/unschedulable", "k8s://e2e/persistentvolumes/weights-v2"} {
		if v := p[d[i]]; v.Action != "keep" || !strings.Contains(why(v), want) {
			t.Errorf("v%d: %s (%s), want kept by %s", i, v.Action, why(v), want)
		}
	}
	if p[d[3]].Action != "delete" || p[d[4]].Action != "keep" {
		t.Errorf("v3 %s, v4 %s: want delete, keep", p[d[3]].Action, p[d[4]].Action)
	}

	// rm refuses the version the Deployment names, by the same source.
	if r := runWith(t, "", env, "rm", repo+"@"+d[0], "--refs", "k8s://e2e"); r.code == 0 || !strings.Contains(r.stderr, "deployments/default/keeper") {
		t.Errorf("rm of the Deployment's version:\n%s", r)
	}

	c.kubectl("delete", "deployment", "keeper", "-n", "default", "--wait=true")
	p, res = plan("k8s://")
	if p == nil {
		t.Fatalf("gc --refs k8s:// failed:\n%s", res)
	}
	if p[d[0]].Action != "delete" || p[d[1]].Action != "keep" {
		t.Errorf("after the Deployment's deletion: v0 %s, v1 %s; want delete, keep", p[d[0]].Action, p[d[1]].Action)
	}

	// A kubeconfig whose client certificate the server does not know
	// fails the plan, and gc --apply deletes nothing.
	bad := filepath.Join(t.TempDir(), "kubeconfig")
	kc, err := os.ReadFile(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(kc), "\n") {
		if strings.Contains(l, "client-certificate:") || strings.Contains(l, "client-key:") {
			continue
		}
		lines = append(lines, l)
	}
	lines = append(lines, "") // keep YAML valid
	os.WriteFile(bad, []byte(strings.ReplaceAll(strings.Join(lines, "\n"), "user:\n", "user:\n    token: not-a-token\n")), 0o600)
	r := runWith(t, "", []string{"KUBECONFIG=" + bad}, "gc", repo, "--keep-last", "1", "--keep-tag", "no-such-tag", "--refs", "k8s://", "--apply")
	if r.code == 0 || !strings.Contains(r.stderr, "unauthorized") || strings.Contains(r.stderr, "not-a-token") {
		t.Errorf("gc with refused credentials:\n%s", r)
	}
	if after, _ := plan(); len(after) != 5 {
		var ds []string
		for k := range after {
			ds = append(ds, k)
		}
		t.Errorf("versions after a refused gc --apply: %s", strings.Join(ds, " "))
	}
}

// TestGCRefsRefusesAnAnswerThatIsNotAList runs gc --apply --refs k8s://
// against an API server (kube-apiserver's wire format, over TLS with a
// token) whose pod list answers 200 with something that is not a PodList,
// as a proxy or an aggregated API may: an empty object, a Status. The plan
// fails and no version is deleted; the same server answering a real
// PodList keeps the version its pod names.
func TestGCRefsRefusesAnAnswerThatIsNotAList(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/team/badrefs"
	var d [3]string
	for i := range d {
		src := t.TempDir()
		os.WriteFile(filepath.Join(src, "v.txt"), []byte(fmt.Sprintf("version %d\n", i)), 0o644)
		d[i] = pushJSON(t, repo+fmt.Sprintf(":v%d", i), src).Digest
	}
	lists := map[string][2]string{ // path -> apiVersion, kind of its list
		"/api/v1/pods": {"v1", "PodList"}, "/api/v1/persistentvolumes": {"v1", "PersistentVolumeList"},
		"/api/v1/configmaps": {"v1", "ConfigMapList"}, "/apis/apps/v1/deployments": {"apps/v1", "DeploymentList"},
		"/apis/apps/v1/statefulsets": {"apps/v1", "StatefulSetList"}, "/apis/apps/v1/daemonsets": {"apps/v1", "DaemonSetList"},
		"/apis/apps/v1/replicasets": {"apps/v1", "ReplicaSetList"}, "/apis/batch/v1/jobs": {"batch/v1", "JobList"},
		"/apis/batch/v1/cronjobs": {"batch/v1", "CronJobList"},
	}
	podList := fmt.Sprintf(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[`+
		`{"metadata":{"namespace":"default","name":"runner"},"spec":{"containers":[{"name":"c","image":"busybox"}],`+
		`"volumes":[{"name":"w","csi":{"driver":%q,"volumeAttributes":{"ref":%q}}}]}}]}`, driverName, repo+"@"+d[0])
	var pods atomic.Value
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		l, ok := lists[r.URL.Path]
		if r.Header.Get("Authorization") != "Bearer e2e-token" || !ok {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"NotFound","code":404}`)
			return
		}
		if r.URL.Path == "/api/v1/pods" {
			fmt.Fprint(w, pods.Load().(string))
			return
		}
		fmt.Fprintf(w, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"9"},"items":[]}`, l[1], l[0])
	}))
	t.Cleanup(srv.Close)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
current-context: fake
clusters: [{name: fake, cluster: {server: %q, certificate-authority-data: %s}}]
contexts: [{name: fake, context: {cluster: fake, user: fake}}]
users: [{name: fake, user: {token: e2e-token}}]
`, srv.URL, base64.StdEncoding.EncodeToString(ca))), 0o600)
	env := []string{"KUBECONFIG=" + kubeconfig}
	gc := []string{"gc", repo, "--keep-last", "1", "--keep-tag", "no-such-tag", "--refs", "k8s://"}

	for _, body := range []string{`{}`, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","code":200}`} {
		pods.Store(body)
		r := runWith(t, "", env, append(gc, "--apply")...)
		if r.code == 0 || !strings.Contains(r.stderr, "listing pods") {
			t.Errorf("gc --apply with pods answered %s:\n%s", body, r)
		}
		if vs := versionDigests(t, repo); len(vs) != len(d) {
			t.Fatalf("pods answered %s: %d versions left of %d", body, len(vs), len(d))
		}
	}

	pods.Store(podList)
	r := runWith(t, "", env, append(gc, "--json")...)
	var g gcJSON
	if r.code != 0 {
		t.Fatalf("gc with a real PodList:\n%s", r)
	}
	mustJSON(t, []byte(r.stdout), &g)
	for _, v := range g.Plan.Versions {
		if want := map[string]string{d[0]: "keep", d[1]: "delete", d[2]: "keep"}[v.Digest]; v.Action != want {
			t.Errorf("%s: %s, want %s", v.Digest, v.Action, want)
		}
	}
}
