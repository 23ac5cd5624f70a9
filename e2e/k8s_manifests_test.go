package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	csiDriver     = "csi.bdnvol.dev"
	manifestsDir  = "../deploy/kubernetes"
	pluginHostDir = "/var/lib/kubelet/plugins/" + csiDriver
)

// pinnedImageRE is an image reference pinned to a sha256 digest.
var pinnedImageRE = regexp.MustCompile(`^[^@\s]+@sha256:[0-9a-f]{64}$`)

// k8sObject is one decoded manifest document.
type k8sObject struct {
	file string
	kind string
	obj  any
}

// newObject returns an empty typed object for apiVersion and kind.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "storage.k8s.io/v1 CSIDriver":
		return &storagev1.CSIDriver{}, nil
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &serviceMonitor{}, nil
	case "v1 Pod":
		return &corev1.Pod{}, nil
	case "v1 PersistentVolume":
		return &corev1.PersistentVolume{}, nil
	case "v1 PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	}
	return nil, fmt.Errorf("unexpected apiVersion %q kind %q", apiVersion, kind)
}

// decodeStrict decodes every document of a YAML file into k8s.io/api types,
// failing on unknown or duplicated fields.
func decodeStrict(name string, b []byte) ([]k8sObject, error) {
	var out []k8sObject
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if string(bytes.TrimSpace(js)) == "null" {
			continue // an empty document (comments only)
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		obj, err := newObject(tm.APIVersion, tm.Kind)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			return nil, fmt.Errorf("%s: document %d (%s): %w", name, i, tm.Kind, err)
		}
		out = append(out, k8sObject{file: name, kind: tm.Kind, obj: obj})
	}
}

// loadManifests decodes every *.yaml under deploy/kubernetes.
func loadManifests(t *testing.T) []k8sObject {
	t.Helper()
	var out []k8sObject
	err := filepath.WalkDir(manifestsDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".yaml" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		objs, err := decodeStrict(p, b)
		if err != nil {
			return err
		}
		if len(objs) == 0 {
			return fmt.Errorf("%s: no objects", p)
		}
		out = append(out, objs...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestKubernetesManifestsStrictDecode(t *testing.T) {
	// The decoder refuses what the API server would drop or refuse.
	for name, doc := range map[string]string{
		"a misspelt field":   "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v, mountPropogation: Bidirectional}]}]\n",
		"a duplicated field": "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nmetadata: {name: q}\n",
		"an unknown kind":    "apiVersion: v1\nkind: Pood\nmetadata: {name: p}\n",
	} {
		if _, err := decodeStrict(name, []byte(doc)); err == nil {
			t.Errorf("%s decoded without error", name)
		}
	}
	objs := loadManifests(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.kind]++
	}
	for _, k := range []string{"CSIDriver", "DaemonSet", "ServiceAccount", "Pod", "Deployment", "PersistentVolume", "PersistentVolumeClaim"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in %s", k, manifestsDir)
		}
	}
}

func TestKubernetesCSIDriverObject(t *testing.T) {
	var drivers []*storagev1.CSIDriver
	for _, o := range loadManifests(t) {
		if d, ok := o.obj.(*storagev1.CSIDriver); ok {
			drivers = append(drivers, d)
		}
	}
	if len(drivers) != 1 {
		t.Fatalf("%d CSIDriver objects, want 1", len(drivers))
	}
	d := drivers[0]
	s := d.Spec
	modes := fmt.Sprint(s.VolumeLifecycleModes)
	if d.Name != csiDriver || s.AttachRequired == nil || *s.AttachRequired || s.PodInfoOnMount == nil || !*s.PodInfoOnMount ||
		modes != "[Ephemeral Persistent]" || s.FSGroupPolicy == nil || *s.FSGroupPolicy != storagev1.NoneFSGroupPolicy {
		t.Fatalf("CSIDriver %s: attachRequired %v podInfoOnMount %v modes %s fsGroupPolicy %v",
			d.Name, deref(s.AttachRequired), deref(s.PodInfoOnMount), modes, deref(s.FSGroupPolicy))
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// podView answers where a container's paths lie on the host.
type podView struct {
	spec *corev1.PodSpec
}

func (v podView) volume(name string) *corev1.Volume {
	for i := range v.spec.Volumes {
		if v.spec.Volumes[i].Name == name {
			return &v.spec.Volumes[i]
		}
	}
	return nil
}

// mountFor returns the volume mount of c that holds the container path p
// (the deepest one) and the hostPath volume behind it, or nil.
func (v podView) mountFor(c *corev1.Container, p string) (*corev1.VolumeMount, *corev1.HostPathVolumeSource) {
	var best *corev1.VolumeMount
	for i := range c.VolumeMounts {
		m := &c.VolumeMounts[i]
		if (p == m.MountPath || strings.HasPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/")) && (best == nil || len(m.MountPath) > len(best.MountPath)) {
			best = m
		}
	}
	if best == nil {
		return nil, nil
	}
	vol := v.volume(best.Name)
	if vol == nil || vol.HostPath == nil {
		return best, nil
	}
	return best, vol.HostPath
}

// hostPath returns where the container path p of c lies on the host, or ""
// when it is not on a hostPath volume.
func (v podView) hostPath(c *corev1.Container, p string) string {
	m, hp := v.mountFor(c, p)
	if hp == nil {
		return ""
	}
	return path.Join(hp.Path, strings.TrimPrefix(p, m.MountPath))
}

// flag returns the value of --name=VALUE in c's args, or "".
func flag(c *corev1.Container, name string) string {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestKubernetesNodePlugin checks the DaemonSets against what the plugin
// needs: the registrar, the plugin's socket and the driver name agree; the
// bdnvol containers are privileged, have /dev/fuse and the kubelet
// directory with Bidirectional propagation, and agree on their directories;
// the mounter runs in a DaemonSet of its own that an upgrade of the node
// plugin does not touch; every image is pinned by digest.
func TestKubernetesNodePlugin(t *testing.T) {
	objs := loadManifests(t)
	checkNodePlugin(t, objs, "/var/lib/bdnvol/")
	// The default metrics name no digest (a pod reaching the port would
	// learn every version on the node).
	for _, o := range objs {
		if ds, ok := o.obj.(*appsv1.DaemonSet); ok {
			for _, c := range ds.Spec.Template.Spec.Containers {
				if slices.Contains(c.Args, "--metrics-digests") {
					t.Errorf("%s runs with --metrics-digests by default", ds.Name)
				}
			}
		}
	}
}

// checkNodePlugin is TestKubernetesNodePlugin on objs (the plain manifests
// or a rendering of the Helm chart), whose chunk cache lies on the host
// under cacheHost.
func checkNodePlugin(t *testing.T, objs []k8sObject, cacheHost string) {
	t.Helper()
	var dss []*appsv1.DaemonSet
	sas := map[string]bool{}
	for _, o := range objs {
		switch x := o.obj.(type) {
		case *appsv1.DaemonSet:
			dss = append(dss, x)
		case *corev1.ServiceAccount:
			sas[x.Namespace+"/"+x.Name] = true
		}
		// Images of the plugin itself are pinned; examples are the user's.
		if filepath.Base(filepath.Dir(o.file)) == "examples" {
			continue
		}
		if pod := podSpec(o.obj); pod != nil {
			for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
				if !pinnedImageRE.MatchString(c.Image) {
					t.Errorf("%s: container %s: image %q is not pinned by @sha256:<64 hex>", o.file, c.Name, c.Image)
				}
			}
		}
	}
	var registrar, mounter, node, holder *corev1.Container
	views := map[*corev1.Container]podView{}
	owner := map[*corev1.Container]*appsv1.DaemonSet{}
	for _, ds := range dss {
		spec := &ds.Spec.Template.Spec
		if !sas[ds.Namespace+"/"+spec.ServiceAccountName] {
			t.Errorf("DaemonSet %s/%s runs as %s, which no manifest creates", ds.Namespace, ds.Name, spec.ServiceAccountName)
		}
		if sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector); err != nil || !sel.Matches(labelSet(ds.Spec.Template.Labels)) {
			t.Errorf("DaemonSet %s: the selector does not match its pod template: %v", ds.Name, err)
		}
		for i := range spec.Containers {
			c := &spec.Containers[i]
			views[c], owner[c] = podView{spec}, ds
			switch {
			case strings.Contains(c.Image, "/csi-node-driver-registrar"):
				registrar = c
			case len(c.Args) >= 2 && c.Args[0] == "csi" && c.Args[1] == "mounter":
				mounter = c
			case len(c.Args) >= 2 && c.Args[0] == "csi" && c.Args[1] == "node":
				node = c
			case len(c.Args) >= 2 && c.Args[0] == "csi" && c.Args[1] == "fd-holder":
				holder = c
			}
		}
	}
	if registrar == nil || mounter == nil || node == nil {
		t.Fatalf("containers: registrar %v, bdnvol csi mounter %v, bdnvol csi node %v", registrar != nil, mounter != nil, node != nil)
	}
	if mounter.Image != node.Image {
		t.Errorf("mounter runs %s, node runs %s", mounter.Image, node.Image)
	}
	if owner[registrar] != owner[node] {
		t.Errorf("the registrar runs in %s, the node plugin in %s: they share the socket directory", owner[registrar].Name, owner[node].Name)
	}
	// Upgrading the node plugin recreates its pods: the mounter must not be
	// among them.
	if m := owner[mounter]; m == owner[node] {
		t.Errorf("the mounter runs in DaemonSet %s with the node plugin: want a DaemonSet of its own", m.Name)
	}
	vw := func(c *corev1.Container) podView { return views[c] }
	for _, p := range fdHolderProblems(mounter, holder, owner, views) {
		t.Error(p)
	}

	// kubelet finds the plugin's socket where the registrar says it is.
	regPath := flag(registrar, "kubelet-registration-path")
	if regPath != pluginHostDir+"/csi.sock" {
		t.Errorf("kubelet-registration-path %q, want %s/csi.sock", regPath, pluginHostDir)
	}
	endpoint, ok := strings.CutPrefix(flag(node, "endpoint"), "unix://")
	if !ok {
		t.Fatalf("node --endpoint %q is not a unix:// socket", flag(node, "endpoint"))
	}
	if got := vw(node).hostPath(node, endpoint); got != regPath {
		t.Errorf("the plugin listens on %s (host %s), the registrar registers %s", endpoint, got, regPath)
	}
	if got := vw(registrar).hostPath(registrar, flag(registrar, "csi-address")); got != regPath {
		t.Errorf("the registrar dials %s (host %s), it registers %s", flag(registrar, "csi-address"), got, regPath)
	}
	if _, hp := vw(registrar).mountFor(registrar, "/registration/x"); hp == nil || hp.Path != "/var/lib/kubelet/plugins_registry" {
		t.Errorf("the registrar's /registration is not the host's /var/lib/kubelet/plugins_registry: %+v", hp)
	}
	if _, hp := vw(node).mountFor(node, endpoint); hp == nil || hp.Path != pluginHostDir {
		t.Errorf("the socket dir is not the hostPath %s: %+v", pluginHostDir, hp)
	}

	privileged := []*corev1.Container{mounter, node}
	if holder != nil {
		privileged = append(privileged, holder)
	}
	for _, c := range privileged {
		sc := c.SecurityContext
		if sc == nil || sc.Privileged == nil || !*sc.Privileged {
			t.Errorf("%s is not privileged", c.Name)
		}
		m, hp := vw(c).mountFor(c, "/var/lib/kubelet")
		if hp == nil || hp.Path != "/var/lib/kubelet" || m.MountPath != "/var/lib/kubelet" ||
			m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
			t.Errorf("%s: /var/lib/kubelet is not the host's with Bidirectional propagation: %+v %+v", c.Name, m, hp)
		}
	}
	for _, c := range []*corev1.Container{mounter, node} {
		if m, hp := vw(c).mountFor(c, "/dev/fuse"); hp == nil || hp.Path != "/dev/fuse" || m.MountPath != "/dev/fuse" ||
			hp.Type == nil || *hp.Type != corev1.HostPathCharDev {
			t.Errorf("%s: no /dev/fuse character device: %+v", c.Name, hp)
		}
		for _, f := range []string{"state-dir", "mounts-dir", "mounter-socket"} {
			val := flag(c, f)
			if val == "" || flag(mounter, f) != flag(node, f) {
				t.Errorf("--%s: mounter %q, node %q", f, flag(mounter, f), flag(node, f))
			}
			if vw(c).hostPath(c, val) == "" {
				t.Errorf("%s: --%s=%s is not on a hostPath: it would not survive a restart", c.Name, f, val)
			}
		}
		// The per-digest mounts and the mounter's socket lie under the
		// plugin's directory, reached through the Bidirectional mount.
		for _, f := range []string{"mounts-dir", "mounter-socket"} {
			m, _ := vw(c).mountFor(c, flag(c, f))
			if hp := vw(c).hostPath(c, flag(c, f)); !strings.HasPrefix(hp, pluginHostDir+"/") || m == nil || m.MountPropagation == nil ||
				*m.MountPropagation != corev1.MountPropagationBidirectional {
				t.Errorf("%s: --%s=%s lies at %s on the host, not under %s through a Bidirectional mount", c.Name, f, flag(c, f), hp, pluginHostDir)
			}
		}
	}
	// A container that sees the per-digest FUSE mounts through a mount
	// without propagation keeps a private copy of each one mounted when it
	// was created (the node plugin after a restart): the mounter's unmount
	// then never completes, and the node plugin waits on it for ever.
	mountsHost := vw(node).hostPath(node, flag(node, "mounts-dir"))
	for _, c := range []*corev1.Container{registrar, mounter, node, holder} {
		if c == nil {
			continue
		}
		for i := range c.VolumeMounts {
			m := &c.VolumeMounts[i]
			vol := vw(c).volume(m.Name)
			if vol == nil || vol.HostPath == nil || !strings.HasPrefix(mountsHost+"/", strings.TrimSuffix(vol.HostPath.Path, "/")+"/") {
				continue
			}
			if m.MountPropagation == nil || *m.MountPropagation == corev1.MountPropagationNone {
				t.Errorf("%s: %s (host %s) holds the FUSE mounts under %s but has no mountPropagation (want HostToContainer or Bidirectional)",
					c.Name, m.MountPath, vol.HostPath.Path, mountsHost)
			}
		}
	}
	if hp := vw(mounter).hostPath(mounter, flag(mounter, "cache-dir")); !strings.HasPrefix(hp+"/", cacheHost) {
		t.Errorf("the chunk cache %q is at %q on the host, want under %s", flag(mounter, "cache-dir"), hp, cacheHost)
	}
	if nid := flag(node, "node-id"); nid != "" && nid != "$(NODE_NAME)" {
		t.Errorf("node --node-id=%s, want $(NODE_NAME)", nid)
	}
	var nodeName *corev1.EnvVar
	for i := range node.Env {
		if node.Env[i].Name == "NODE_NAME" {
			nodeName = &node.Env[i]
		}
	}
	if nodeName == nil || nodeName.ValueFrom == nil || nodeName.ValueFrom.FieldRef == nil || nodeName.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("node: NODE_NAME does not come from spec.nodeName: %+v", nodeName)
	}
}

// fdHolderProblems checks the mounter's update strategy against the fd
// holder (holder is nil when no manifest runs one): a mounter may roll only
// when a holder keeps its mounts alive across the restart, which needs the
// holder in a DaemonSet of its own, updated OnDelete (a holder that rolls
// with the mounter, or with anything else, would drop the descriptors the
// new mounter needs), listening where the mounter's --fd-holder points on
// the host. A mounter without the holder is updated OnDelete.
func fdHolderProblems(mounter, holder *corev1.Container, owner map[*corev1.Container]*appsv1.DaemonSet, views map[*corev1.Container]podView) []string {
	var out []string
	m := owner[mounter]
	strategy := m.Spec.UpdateStrategy.Type
	sock := flag(mounter, "fd-holder")
	switch strategy {
	case appsv1.OnDeleteDaemonSetStrategyType:
	case appsv1.RollingUpdateDaemonSetStrategyType:
		if sock == "" {
			out = append(out, fmt.Sprintf("the mounter DaemonSet %s is updated by rolling update, but its mounter has no --fd-holder: "+
				"each restart would cut the node's readers off (want OnDelete, or the fd holder)", m.Name))
		}
		if ru := m.Spec.UpdateStrategy.RollingUpdate; ru != nil && (ru.MaxSurge != nil && ru.MaxSurge.IntValue() != 0 ||
			ru.MaxUnavailable != nil && ru.MaxUnavailable.String() != "1") {
			out = append(out, fmt.Sprintf("the mounter DaemonSet %s rolls with maxUnavailable %v maxSurge %v: want one node at a time, "+
				"no surge (two mounters on a node would serve one socket)", m.Name, ru.MaxUnavailable, ru.MaxSurge))
		}
	default:
		out = append(out, fmt.Sprintf("the mounter DaemonSet %s has update strategy %q", m.Name, strategy))
	}
	if sock == "" {
		return out
	}
	if holder == nil {
		return append(out, fmt.Sprintf("the mounter's --fd-holder=%s names a holder no DaemonSet runs", sock))
	}
	h := owner[holder]
	if h == m || slices.ContainsFunc(h.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name != holder.Name }) {
		out = append(out, fmt.Sprintf("the fd holder runs in DaemonSet %s beside other containers: want a DaemonSet of its own", h.Name))
	}
	if h.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		out = append(out, fmt.Sprintf("the fd holder DaemonSet %s has update strategy %q: want OnDelete (it must outlive mounter restarts)",
			h.Name, h.Spec.UpdateStrategy.Type))
	}
	// A node with a mounter and no holder would lose its readers on the
	// first roll.
	hp, mp := &h.Spec.Template.Spec, &m.Spec.Template.Spec
	if jsonOf(hp.NodeSelector) != jsonOf(mp.NodeSelector) || jsonOf(hp.Tolerations) != jsonOf(mp.Tolerations) ||
		jsonOf(hp.Affinity) != jsonOf(mp.Affinity) {
		out = append(out, fmt.Sprintf("the fd holder is placed apart from the mounter: nodeSelector %v tolerations %v affinity %v, the mounter's %v %v %v",
			hp.NodeSelector, hp.Tolerations, hp.Affinity, mp.NodeSelector, mp.Tolerations, mp.Affinity))
	}
	if holder.Image != mounter.Image {
		out = append(out, fmt.Sprintf("the fd holder runs %s, the mounter %s", holder.Image, mounter.Image))
	}
	hs := flag(holder, "socket")
	mh, hh := views[mounter].hostPath(mounter, sock), views[holder].hostPath(holder, hs)
	if mh == "" || mh != hh {
		out = append(out, fmt.Sprintf("the mounter's --fd-holder=%s is %q on the host, the holder's --socket=%s is %q: want one hostPath socket",
			sock, mh, hs, hh))
	}
	// The holder refuses a mount outside its --mounts-dir: it must be the
	// mounter's, on the host.
	md, hd := flag(mounter, "mounts-dir"), flag(holder, "mounts-dir")
	if mdh, hdh := views[mounter].hostPath(mounter, md), views[holder].hostPath(holder, hd); mdh == "" || mdh != hdh {
		out = append(out, fmt.Sprintf("the mounter's --mounts-dir=%s is %q on the host, the holder's --mounts-dir=%s is %q: "+
			"want one directory (the holder refuses mounts elsewhere)", md, mdh, hd, hdh))
	}
	return out
}

func podSpec(obj any) *corev1.PodSpec {
	switch x := obj.(type) {
	case *appsv1.DaemonSet:
		return &x.Spec.Template.Spec
	case *appsv1.Deployment:
		return &x.Spec.Template.Spec
	case *appsv1.StatefulSet:
		return &x.Spec.Template.Spec
	case *corev1.Pod:
		return &x.Spec
	}
	return nil
}

type labelSet map[string]string

func (l labelSet) Has(k string) bool              { _, ok := l[k]; return ok }
func (l labelSet) Get(k string) string            { return l[k] }
func (l labelSet) Lookup(k string) (string, bool) { v, ok := l[k]; return v, ok }

func TestKubernetesExamples(t *testing.T) {
	objs := loadManifests(t)
	pvs := map[string]*corev1.PersistentVolume{}
	var claims []*corev1.PersistentVolumeClaim
	inline := 0
	for _, o := range objs {
		switch x := o.obj.(type) {
		case *corev1.PersistentVolume:
			pvs[x.Name] = x
			c := x.Spec.CSI
			if c == nil || c.Driver != csiDriver || !c.ReadOnly || !slices.Equal(x.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}) {
				t.Errorf("%s: PersistentVolume %s is not a read-only ReadOnlyMany %s volume: %+v", o.file, x.Name, csiDriver, x.Spec)
			} else if c.VolumeHandle == "" && c.VolumeAttributes["ref"] == "" {
				t.Errorf("%s: PersistentVolume %s names no reference", o.file, x.Name)
			}
		case *corev1.PersistentVolumeClaim:
			claims = append(claims, x)
		}
		pod := podSpec(o.obj)
		if pod == nil {
			continue
		}
		for _, vol := range pod.Volumes {
			if vol.CSI == nil {
				continue
			}
			inline++
			if vol.CSI.Driver != csiDriver || vol.CSI.VolumeAttributes["ref"] == "" || vol.CSI.ReadOnly == nil || !*vol.CSI.ReadOnly {
				t.Errorf("%s: volume %s: want a read-only %s volume with a ref attribute: %+v", o.file, vol.Name, csiDriver, vol.CSI)
			}
		}
	}
	if inline == 0 || len(claims) == 0 {
		t.Fatalf("examples: %d inline volumes, %d claims", inline, len(claims))
	}
	for _, c := range claims {
		pv := pvs[c.Spec.VolumeName]
		if pv == nil || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Name != c.Name || pv.Spec.ClaimRef.Namespace != c.Namespace ||
			c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != pv.Spec.StorageClassName {
			t.Errorf("claim %s/%s does not bind to its PersistentVolume %q", c.Namespace, c.Name, c.Spec.VolumeName)
		}
	}
}
