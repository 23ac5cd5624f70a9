package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/bdnvol/bdnvol/e2e/helmchart"
)

const chartDir = "../deploy/helm/bdnvol-csi"

// renderChart renders the chart with Helm's engine into kube-system, with
// values (YAML) over the chart's defaults and the API versions extra
// added to the default capabilities, and decodes the result strictly.
func renderChart(t *testing.T, values string, extra ...string) []k8sObject {
	t.Helper()
	out, err := helmchart.Render(chartDir, "kube-system", values, extra...)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	var objs []k8sObject
	for _, n := range names {
		if path.Ext(n) != ".yaml" {
			continue
		}
		got, err := decodeStrict(n, []byte(out[n]))
		if err != nil {
			t.Fatalf("%v\n%s", err, out[n])
		}
		objs = append(objs, got...)
	}
	return objs
}

// byKey indexes objects by kind/namespace/name.
func byKey(t *testing.T, objs []k8sObject) map[string]k8sObject {
	t.Helper()
	out := map[string]k8sObject{}
	for _, o := range objs {
		b, _ := json.Marshal(o.obj)
		var m struct {
			metav1.ObjectMeta `json:"metadata"`
		}
		json.Unmarshal(b, &m)
		k := o.kind + "/" + m.Namespace + "/" + m.Name
		if _, dup := out[k]; dup {
			t.Errorf("%s twice", k)
		}
		out[k] = o
	}
	return out
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// plainManifests are the objects of deploy/kubernetes without the examples.
func plainManifests(t *testing.T) []k8sObject {
	var out []k8sObject
	for _, o := range loadManifests(t) {
		if filepath.Dir(o.file) == manifestsDir {
			out = append(out, o)
		}
	}
	return out
}

// TestKubernetesManifestsFromChart: deploy/kubernetes is what the chart
// renders with its default values (make deploy-manifests), byte for byte,
// and holds no other manifest beside its examples.
func TestKubernetesManifestsFromChart(t *testing.T) {
	want, err := helmchart.Manifests(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join(manifestsDir, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("%s/%s is not what the chart renders (run make deploy-manifests): %v", manifestsDir, name, err)
		}
	}
	have, err := filepath.Glob(filepath.Join(manifestsDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range have {
		if _, ok := want[filepath.Base(p)]; !ok {
			t.Errorf("%s is not rendered from the chart", p)
		}
	}
	if len(have) != len(want) || len(want) < 5 {
		t.Errorf("%d manifests, %d rendered: %v", len(have), len(want), have)
	}
}

// TestHelmChartMatchesManifests renders the chart with its default values
// and checks that it gives the objects of deploy/kubernetes, field for
// field: the plain manifests and the chart are one source.
func TestHelmChartMatchesManifests(t *testing.T) {
	chart := byKey(t, renderChart(t, ""))
	plain := byKey(t, plainManifests(t))
	for k, p := range plain {
		c, ok := chart[k]
		if !ok {
			t.Errorf("%s (%s) is not in the chart", k, p.file)
			continue
		}
		if a, b := jsonOf(p.obj), jsonOf(c.obj); a != b {
			t.Errorf("%s differs:\n  %s: %s\n  chart %s: %s", k, p.file, a, c.file, b)
		}
	}
	for k, c := range chart {
		if _, ok := plain[k]; !ok {
			t.Errorf("the chart's %s (%s) is not in %s", k, c.file, manifestsDir)
		}
	}
	// Without the Prometheus operator's CRD there is no ServiceMonitor.
	for k := range chart {
		if strings.HasPrefix(k, "ServiceMonitor/") || k == "Service/kube-system/bdnvol-csi-metrics" {
			t.Errorf("%s rendered without the monitoring.coreos.com/v1 API", k)
		}
	}
}

// TestHelmChartGPUValues renders the chart for GPU nodes with a cache on a
// local disk, a warm list and mirror configuration, and checks the result
// still holds what the plugin needs, with the values where they belong.
func TestHelmChartGPUValues(t *testing.T) {
	objs := renderChart(t, `
image: registry.example.com/bdnvol/bdnvol@sha256:`+strings.Repeat("ab", 32)+`
cache: {size: 200GiB, hostPath: /mnt/nvme/bdnvol-cache}
warm:
  refs:
    - registry.example.com/team/llama:prod
    - registry.example.com/team/llama:canary *.json,*.safetensors
  bandwidth: 1GiB
  resolveInterval: 1m
mirrors:
  hosts:
    "registry.example.com:5000": |
      server = "https://registry.example.com:5000"
      [host."http://harbor.cache.svc:8080"]
        capabilities = ["pull", "resolve"]
nodeSelector: {kubernetes.io/os: linux, nvidia.com/gpu.present: "true"}
tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
resources:
  mounter: {requests: {cpu: "1", memory: 1Gi}}
`)
	checkNodePlugin(t, objs, "/mnt/nvme/bdnvol-cache/")
	plain := byKey(t, plainManifests(t))
	got := byKey(t, objs)
	for _, k := range []string{"CSIDriver//csi.bdnvol.dev", "ServiceAccount/kube-system/bdnvol-csi"} {
		if jsonOf(got[k].obj) != jsonOf(plain[k].obj) {
			t.Errorf("%s differs from %s", k, manifestsDir)
		}
	}
	var mounter *corev1.Container
	var mounterPod *corev1.PodSpec
	for _, name := range []string{"bdnvol-csi-mounter", "bdnvol-csi-node", "bdnvol-csi-fdholder"} {
		ds := got["DaemonSet/kube-system/"+name].obj.(*appsv1.DaemonSet)
		spec := &ds.Spec.Template.Spec
		if spec.NodeSelector["nvidia.com/gpu.present"] != "true" || len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "nvidia.com/gpu" {
			t.Errorf("%s: nodeSelector %v tolerations %v", name, spec.NodeSelector, spec.Tolerations)
		}
		if name == "bdnvol-csi-mounter" {
			mounterPod, mounter = spec, &spec.Containers[0]
		}
		// The node DaemonSet is the plain one with the placement changed.
		if name == "bdnvol-csi-node" {
			want := plain["DaemonSet/kube-system/"+name].obj.(*appsv1.DaemonSet).DeepCopy()
			want.Spec.Template.Spec.NodeSelector, want.Spec.Template.Spec.Tolerations = spec.NodeSelector, spec.Tolerations
			want.Spec.Template.Spec.Containers[0].Image = spec.Containers[0].Image
			if jsonOf(want) != jsonOf(ds) {
				t.Errorf("the node DaemonSet differs from %s beyond placement and image:\n%s\n%s", manifestsDir, jsonOf(want), jsonOf(ds))
			}
		}
	}
	for f, want := range map[string]string{"cache-size": "200GiB", "warm-bandwidth": "1GiB", "warm-resolve-interval": "1m",
		"hosts-dir": "/etc/bdnvol/certs.d", "metrics-addr": "[$(POD_IP)]:9808"} {
		if got := flag(mounter, f); got != want {
			t.Errorf("mounter --%s=%q, want %q", f, got, want)
		}
	}
	if q := mounter.Resources.Requests[corev1.ResourceMemory]; q.String() != "1Gi" {
		t.Errorf("mounter memory request %s, want 1Gi", q.String())
	}
	// The warm list reaches the mounter's --warm-list through the ConfigMap.
	cm := got["ConfigMap/kube-system/bdnvol-csi-warm-list"].obj.(*corev1.ConfigMap)
	m, _ := podView{mounterPod}.mountFor(mounter, flag(mounter, "warm-list"))
	vol := podView{mounterPod}.volume(m.Name)
	if vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != cm.Name {
		t.Fatalf("--warm-list %s is not on the ConfigMap %s: %+v", flag(mounter, "warm-list"), cm.Name, vol)
	}
	key := strings.TrimPrefix(flag(mounter, "warm-list"), m.MountPath+"/")
	if l := cm.Data[key]; !strings.Contains(l, "\nregistry.example.com/team/llama:prod\n") ||
		!strings.Contains(l, "\nregistry.example.com/team/llama:canary *.json,*.safetensors\n") {
		t.Errorf("warm list %q lacks the entries", l)
	}
	// hosts.toml lands at --hosts-dir/<registry>/hosts.toml.
	hosts := got["ConfigMap/kube-system/bdnvol-csi-hosts"].obj.(*corev1.ConfigMap)
	hm, _ := podView{mounterPod}.mountFor(mounter, "/etc/bdnvol/certs.d/x")
	hv := podView{mounterPod}.volume(hm.Name)
	if hv == nil || hv.ConfigMap == nil || hv.ConfigMap.Name != hosts.Name || len(hv.ConfigMap.Items) != 1 ||
		hv.ConfigMap.Items[0].Path != "registry.example.com:5000/hosts.toml" ||
		!strings.Contains(hosts.Data[hv.ConfigMap.Items[0].Key], `[host."http://harbor.cache.svc:8080"]`) {
		t.Errorf("hosts.toml is not mounted at --hosts-dir/registry.example.com:5000/hosts.toml: %+v %+v", hv, hosts.Data)
	}
	if hp := (podView{mounterPod}).hostPath(mounter, flag(mounter, "cache-dir")); !strings.HasPrefix(hp, "/mnt/nvme/bdnvol-cache") {
		t.Errorf("the cache is at %s on the host", hp)
	}
}

// TestHelmChartServiceMonitor renders the chart where the Prometheus
// operator's CRD exists: a ServiceMonitor and a headless Service select the
// mounter pods' metrics port.
func TestHelmChartServiceMonitor(t *testing.T) {
	objs := renderChart(t, "metrics: {port: 9900, digests: true, serviceMonitor: {interval: 15s, labels: {release: prom}}}\n",
		"monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor")
	checkNodePlugin(t, objs, "/var/lib/bdnvol/")
	got := byKey(t, objs)
	smo, ok := got["ServiceMonitor/kube-system/bdnvol-csi"]
	svo, ok2 := got["Service/kube-system/bdnvol-csi-metrics"]
	if !ok || !ok2 {
		t.Fatalf("no ServiceMonitor (%v) or Service (%v) with the CRD present", ok, ok2)
	}
	sm, svc := smo.obj.(*serviceMonitor), svo.obj.(*corev1.Service)
	ds := got["DaemonSet/kube-system/bdnvol-csi-mounter"].obj.(*appsv1.DaemonSet)
	podLabels := labels.Set(ds.Spec.Template.Labels)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("the Service selects %v, not the mounter pods %v", svc.Spec.Selector, podLabels)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(svc.Labels)) {
		t.Errorf("the ServiceMonitor selects %v, not the Service %v", sm.Spec.Selector, svc.Labels)
	}
	if sm.Labels["release"] != "prom" || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Interval != "15s" || sm.Spec.Endpoints[0].Port != "metrics" {
		t.Errorf("ServiceMonitor: labels %v endpoints %+v", sm.Labels, sm.Spec.Endpoints)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if flag(&c, "metrics-addr") != "[$(POD_IP)]:9900" || expandArg(&c, flag(&c, "metrics-addr"), "10.1.2.3") != "[10.1.2.3]:9900" || ports["metrics"] != 9900 ||
		len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9900 || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("metrics port: args %v ports %+v service %+v", c.Args, c.Ports, svc.Spec.Ports)
	}
	if !slices.Contains(c.Args, "--metrics-digests") {
		t.Errorf("metrics.digests: true does not pass --metrics-digests: %v", c.Args)
	}
}

// TestHelmChartMetricsLoopback: metrics.host 127.0.0.1 keeps the metrics
// inside the mounter's pod, and renders no ServiceMonitor (Prometheus could
// not reach them) even where the CRD exists.
func TestHelmChartMetricsLoopback(t *testing.T) {
	objs := renderChart(t, "metrics: {host: 127.0.0.1}\npeers: {enabled: false}\n", "monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor")
	got := byKey(t, objs)
	if _, ok := got["ServiceMonitor/kube-system/bdnvol-csi"]; ok {
		t.Error("a ServiceMonitor is rendered for metrics on the pod's loopback")
	}
	c := mounterContainer(t, objs)
	if a := flag(c, "metrics-addr"); a != "[127.0.0.1]:9808" {
		t.Errorf("--metrics-addr=%s, want [127.0.0.1]:9808", a)
	}
	if len(c.Env) != 0 {
		t.Errorf("env %+v, want none (the peer tier off: POD_IP is for the metrics and the peers only)", c.Env)
	}
}

// TestHelmChartKubeletDir: a kubelet with another root directory gets the
// node plugin's --kubelet-dir, which confines its target paths.
func TestHelmChartKubeletDir(t *testing.T) {
	objs := renderChart(t, "image: registry.example.com/bdnvol/bdnvol@sha256:"+strings.Repeat("ab", 32)+"\nkubeletDir: /data/kubelet\n")
	ds := byKey(t, objs)["DaemonSet/kube-system/bdnvol-csi-node"].obj.(*appsv1.DaemonSet)
	node := &ds.Spec.Template.Spec.Containers[0]
	if got := flag(node, "kubelet-dir"); got != "/data/kubelet" {
		t.Errorf("node --kubelet-dir=%q, want /data/kubelet", got)
	}
	if got := flag(node, "mounts-dir"); !strings.HasPrefix(got, "/data/kubelet/") {
		t.Errorf("node --mounts-dir=%q, not under the kubelet directory", got)
	}
}

// TestHelmChartWithoutFdHolder: fdHolder.enabled false renders no holder,
// and the mounter goes back to OnDelete without --fd-holder (a restart then
// cuts readers off, so it must not roll).
func TestHelmChartWithoutFdHolder(t *testing.T) {
	objs := renderChart(t, "fdHolder: {enabled: false}\n")
	checkNodePlugin(t, objs, "/var/lib/bdnvol/")
	got := byKey(t, objs)
	for k := range got {
		if strings.Contains(k, "fdholder") {
			t.Errorf("%s rendered with fdHolder.enabled false", k)
		}
	}
	for _, o := range objs {
		if pod := podSpec(o.obj); pod != nil {
			for _, c := range pod.Containers {
				if slices.Contains(c.Args, "fd-holder") {
					t.Errorf("%s: container %s runs the fd holder", o.file, c.Name)
				}
			}
		}
	}
	ds := got["DaemonSet/kube-system/bdnvol-csi-mounter"].obj.(*appsv1.DaemonSet)
	if s := ds.Spec.UpdateStrategy; s.Type != appsv1.OnDeleteDaemonSetStrategyType || s.RollingUpdate != nil {
		t.Errorf("mounter update strategy %+v without the holder, want OnDelete", s)
	}
	m := &ds.Spec.Template.Spec.Containers[0]
	for _, a := range m.Args {
		if strings.HasPrefix(a, "--fd-holder") {
			t.Errorf("mounter runs with %s without the holder", a)
		}
	}
	// Apart from those two, the mounter is the default one.
	want := byKey(t, renderChart(t, ""))["DaemonSet/kube-system/bdnvol-csi-mounter"].obj.(*appsv1.DaemonSet).DeepCopy()
	want.Spec.UpdateStrategy = ds.Spec.UpdateStrategy
	wm := &want.Spec.Template.Spec.Containers[0]
	wm.Args = slices.DeleteFunc(wm.Args, func(a string) bool { return strings.HasPrefix(a, "--fd-holder=") })
	if jsonOf(want) != jsonOf(ds) {
		t.Errorf("without the holder the mounter differs beyond its update strategy and --fd-holder:\n%s\n%s", jsonOf(want), jsonOf(ds))
	}
}

// TestKubernetesFdHolderCheck: the check that lets the mounter roll only
// over a holder of its own refuses each way of getting it wrong.
func TestKubernetesFdHolderCheck(t *testing.T) {
	type setup struct {
		mounter, holder *corev1.Container
		owner           map[*corev1.Container]*appsv1.DaemonSet
		views           map[*corev1.Container]podView
	}
	load := func(t *testing.T, values string) setup {
		var s setup
		s.owner, s.views = map[*corev1.Container]*appsv1.DaemonSet{}, map[*corev1.Container]podView{}
		for _, o := range renderChart(t, values) {
			ds, ok := o.obj.(*appsv1.DaemonSet)
			if !ok {
				continue
			}
			for i := range ds.Spec.Template.Spec.Containers {
				c := &ds.Spec.Template.Spec.Containers[i]
				s.owner[c], s.views[c] = ds, podView{&ds.Spec.Template.Spec}
				switch {
				case slices.Equal(c.Args[:2], []string{"csi", "mounter"}):
					s.mounter = c
				case slices.Equal(c.Args[:2], []string{"csi", "fd-holder"}):
					s.holder = c
				}
			}
		}
		if s.mounter == nil {
			t.Fatal("no mounter rendered")
		}
		return s
	}
	if s := load(t, ""); len(fdHolderProblems(s.mounter, s.holder, s.owner, s.views)) != 0 || s.holder == nil {
		t.Fatalf("the default chart: holder %v, problems %v", s.holder != nil, fdHolderProblems(s.mounter, s.holder, s.owner, s.views))
	}
	one := intstr.FromInt32(1)
	for name, c := range map[string]struct {
		values string
		edit   func(s *setup)
		want   string
	}{
		"no holder": {edit: func(s *setup) { s.holder = nil }, want: "names a holder no DaemonSet runs"},
		"rolling without --fd-holder": {values: "fdHolder: {enabled: false}\n", edit: func(s *setup) {
			s.owner[s.mounter].Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType}
		}, want: "has no --fd-holder"},
		"surge": {edit: func(s *setup) { s.owner[s.mounter].Spec.UpdateStrategy.RollingUpdate.MaxSurge = &one }, want: "no surge"},
		"holder rolls": {edit: func(s *setup) {
			s.owner[s.holder].Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType}
		}, want: "want OnDelete"},
		"holder in the mounter's pod": {edit: func(s *setup) { s.owner[s.holder] = s.owner[s.mounter] }, want: "a DaemonSet of its own"},
		"another socket": {edit: func(s *setup) {
			for i, a := range s.holder.Args {
				if strings.HasPrefix(a, "--socket=") {
					s.holder.Args[i] = "--socket=/var/lib/bdnvol/csi/other.sock"
				}
			}
		}, want: "want one hostPath socket"},
		"another mounts directory": {edit: func(s *setup) {
			for i, a := range s.holder.Args {
				if strings.HasPrefix(a, "--mounts-dir=") {
					s.holder.Args[i] = "--mounts-dir=/var/lib/kubelet/plugins/other/mounts"
				}
			}
		}, want: "want one directory"},
		"another host directory": {edit: func(s *setup) {
			spec := s.views[s.holder].spec
			for i := range spec.Volumes {
				if hp := spec.Volumes[i].HostPath; hp != nil && hp.Path == "/var/lib/bdnvol/csi" {
					hp.Path = "/run/bdnvol"
				}
			}
		}, want: "want one hostPath socket"},
		"placed apart": {edit: func(s *setup) {
			s.owner[s.holder].Spec.Template.Spec.NodeSelector = map[string]string{"nvidia.com/gpu.present": "true"}
		}, want: "placed apart from the mounter"},
	} {
		t.Run(name, func(t *testing.T) {
			s := load(t, c.values)
			c.edit(&s)
			ps := fdHolderProblems(s.mounter, s.holder, s.owner, s.views)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("problems %q, want one saying %q", ps, c.want)
			}
		})
	}
}
