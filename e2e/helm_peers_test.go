package e2e

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestHelmChartPeers: by default the chart (and so deploy/kubernetes) runs
// the peer tier: the mounter listens on its pod IP's peer port, which a
// headless Service selecting the mounter pods names, watches that
// Service's EndpointSlices and reads the CA Secret, with a token of its own
// account whose Role allows exactly that. peers.enabled: false renders none
// of it and mounts no token.
func TestHelmChartPeers(t *testing.T) {
	for _, objs := range [][]k8sObject{renderChart(t, ""), plainManifests(t)} {
		got := byKey(t, objs)
		ds := got["DaemonSet/kube-system/bdnvol-csi-mounter"].obj.(*appsv1.DaemonSet)
		spec := ds.Spec.Template.Spec
		c := mounterContainer(t, objs)
		svcObj, ok := got["Service/kube-system/bdnvol-csi-peers"]
		if !ok {
			t.Fatal("no Service bdnvol-csi-peers")
		}
		svc := svcObj.obj.(*corev1.Service)
		if svc.Spec.ClusterIP != "None" || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) {
			t.Errorf("Service: clusterIP %q, selector %v; want headless, selecting the mounter pods %v", svc.Spec.ClusterIP, svc.Spec.Selector, ds.Spec.Template.Labels)
		}
		var port int32
		for _, p := range c.Ports {
			if p.Name == "peer" {
				port = p.ContainerPort
			}
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "peer" || svc.Spec.Ports[0].TargetPort.String() != "peer" || port == 0 {
			t.Errorf("Service ports %+v, container peer port %d", svc.Spec.Ports, port)
		}
		if a := expandArg(c, flag(c, "peer-listen"), "10.1.2.3"); a != "[10.1.2.3]:9809" {
			t.Errorf("--peer-listen expands to %q, want [10.1.2.3]:9809 (the pod IP's peer port)", a)
		}
		if flag(c, "peer-service") != "kube-system/bdnvol-csi-peers" || flag(c, "peer-port-name") != "" && flag(c, "peer-port-name") != "peer" {
			t.Errorf("--peer-service=%s --peer-port-name=%s", flag(c, "peer-service"), flag(c, "peer-port-name"))
		}
		if flag(c, "peer-tls-secret") != "kube-system/bdnvol-csi-peer-ca" {
			t.Errorf("--peer-tls-secret=%s", flag(c, "peer-tls-secret"))
		}
		if _, ok := got["Secret/kube-system/bdnvol-csi-peer-ca"]; !ok {
			t.Error("no Secret bdnvol-csi-peer-ca: the mounters may not create one")
		} else if sec := got["Secret/kube-system/bdnvol-csi-peer-ca"].obj.(*corev1.Secret); len(sec.Data)+len(sec.StringData) != 0 {
			t.Error("the CA Secret is rendered with data: the first mounter makes the CA, so no key is in the chart")
		}
		if spec.ServiceAccountName != "bdnvol-csi-mounter" || spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
			t.Errorf("mounter pod: account %q, automount %v; want its own account's token", spec.ServiceAccountName, spec.AutomountServiceAccountToken)
		}
		for k, o := range got {
			if d, ok := o.obj.(*appsv1.DaemonSet); ok && d.Name != ds.Name {
				if a := d.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || *a {
					t.Errorf("%s mounts a service account token", k)
				}
			}
		}
		role := got["Role/kube-system/bdnvol-csi-peers"].obj.(*rbacv1.Role)
		want := []rbacv1.PolicyRule{
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"bdnvol-csi-peer-ca"}, Verbs: []string{"get", "update"}},
		}
		if jsonOf(role.Rules) != jsonOf(want) {
			t.Errorf("Role rules %s, want %s", jsonOf(role.Rules), jsonOf(want))
		}
		rb := got["RoleBinding/kube-system/bdnvol-csi-peers"].obj.(*rbacv1.RoleBinding)
		if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 ||
			rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != "bdnvol-csi-mounter" || rb.Subjects[0].Namespace != "kube-system" {
			t.Errorf("RoleBinding %+v %+v", rb.RoleRef, rb.Subjects)
		}
	}

	off := renderChart(t, "peers: {enabled: false}\n")
	for k := range byKey(t, off) {
		if strings.Contains(k, "peer") {
			t.Errorf("peers.enabled: false renders %s", k)
		}
	}
	c := mounterContainer(t, off)
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--peer") }) {
		t.Errorf("peers.enabled: false passes %v", c.Args)
	}
	ds := byKey(t, off)["DaemonSet/kube-system/bdnvol-csi-mounter"].obj.(*appsv1.DaemonSet)
	if a := ds.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("peers.enabled: false still mounts the mounter's token")
	}
}
