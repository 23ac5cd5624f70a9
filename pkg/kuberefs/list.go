package kuberefs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/pager"

	"github.com/bdnvol/bdnvol/pkg/kubeclient"
)

// Scheme is the prefix of a cluster reference source: k8s:// for the
// current context (or the pod's own cluster), k8s://CONTEXT for another.
const Scheme = "k8s://"

// resource is one kind read: its API resource and the kind of its lists.
type resource struct {
	gvr      schema.GroupVersionResource
	listKind string
}

// path is the API path of r's list.
func (r resource) path() string {
	if r.gvr.Group == "" {
		return "/api/" + r.gvr.Version + "/" + r.gvr.Resource
	}
	return "/apis/" + r.gvr.Group + "/" + r.gvr.Version + "/" + r.gvr.Resource
}

// resources are the kinds read: every kind whose objects can name a volume
// (an inline CSI volume in a pod template, a persistent volume's
// attributes, the warm list's config map).
var resources = []resource{
	{schema.GroupVersionResource{Version: "v1", Resource: "pods"}, "PodList"},
	{schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumes"}, "PersistentVolumeList"},
	{schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "ConfigMapList"},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, "DeploymentList"},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}, "StatefulSetList"},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}, "DaemonSetList"},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, "ReplicaSetList"},
	{schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, "JobList"},
	{schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "cronjobs"}, "CronJobList"},
}

// Bounds of a read: objects per page and pages per kind (with 500 objects a
// page, 200 pages are 100,000 objects of one kind), and the length of a
// continue token (kube-apiserver's are a few hundred bytes).
const (
	pageLimit   = 500
	maxPages    = 200
	maxContinue = 8 << 10
)

// pageTimeout bounds one page, with the retries client-go makes when a
// server answers 429 or 5xx with a Retry-After (a variable for tests).
var pageTimeout = 2 * time.Minute

// ErrNotCluster is returned by Open for a source that is not a k8s:// one.
var ErrNotCluster = errors.New("not a k8s:// source")

// Cluster reads the objects of one cluster.
type Cluster struct {
	name string         // the context, or kubeclient.InCluster
	rc   rest.Interface // the dynamic client's REST client
}

// IsSource reports whether s names a cluster (k8s://[CONTEXT]).
func IsSource(s string) bool { return strings.HasPrefix(s, Scheme) }

// Open returns the cluster that source (k8s:// or k8s://CONTEXT) names,
// through kubeclient.Config: the context from the kubeconfig files
// (KUBECONFIG, else ~/.kube/config), or, for k8s:// with no kubeconfig, the
// pod's own cluster through its service account. A credential plugin the
// context names runs under ctx.
func Open(ctx context.Context, source string) (*Cluster, error) {
	if !IsSource(source) {
		return nil, ErrNotCluster
	}
	cfg, name, err := kubeclient.Config(ctx, strings.TrimPrefix(source, Scheme))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	// The dynamic client's REST client, asking for JSON only: a page is
	// checked as the JSON it is before it is decoded.
	dcfg := dynamic.ConfigFor(cfg)
	dcfg.AcceptContentTypes = "application/json"
	rc, err := rest.UnversionedRESTClientFor(dcfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return &Cluster{name: name, rc: rc}, nil
}

// Name is the source as its references name it: k8s://CONTEXT.
func (c *Cluster) Name() string { return Scheme + c.name }

// Objects calls visit with every object of the kinds read, as JSON, and a
// name for it (k8s://CONTEXT/RESOURCE/NAMESPACE/NAME). Any list it cannot
// read in full fails the call.
func (c *Cluster) Objects(ctx context.Context, visit func(name string, obj []byte) error) error {
	for _, r := range resources {
		if err := c.list(ctx, r, visit); err != nil {
			return err
		}
	}
	return nil
}

// list reads one kind page by page.
func (c *Cluster) list(ctx context.Context, r resource, visit func(string, []byte) error) error {
	kind := r.gvr.Resource
	pages := 0
	seen := map[string]bool{}
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		if pages == maxPages {
			return nil, fmt.Errorf("more than %d pages of %d", maxPages, pageLimit)
		}
		pages++
		if opts.Continue != "" {
			if len(opts.Continue) > maxContinue {
				return nil, fmt.Errorf("the server's continue token is longer than %d bytes", maxContinue)
			}
			if seen[opts.Continue] {
				return nil, errors.New("the server repeats a continue token")
			}
			seen[opts.Continue] = true
		}
		ctx, cancel := context.WithTimeout(ctx, pageTimeout)
		defer cancel()
		body, err := c.rc.Get().AbsPath(r.path()).
			SpecificallyVersionedParams(&opts, metav1.ParameterCodec, metav1.SchemeGroupVersion).
			Do(ctx).Raw()
		if err != nil {
			return nil, describe(err)
		}
		return decodePage(body, r)
	})
	p.PageSize = pageLimit
	p.PageBufferSize = 1
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return fmt.Errorf("an item is a %T, not an object", obj)
		}
		b, err := u.MarshalJSON()
		if err != nil {
			return fmt.Errorf("an item: %v", err)
		}
		name := c.Name() + "/" + kind + "/"
		if ns := u.GetNamespace(); ns != "" {
			name += ns + "/"
		}
		return visit(name+u.GetName(), b)
	})
	if err != nil {
		return fmt.Errorf("%s: listing %s: %w", c.Name(), kind, err)
	}
	return nil
}

// decodePage accepts a page only if it is a list of the kind asked for:
// its apiVersion and kind are the list's, and it has items (an array, empty
// or not). A 200 answer that is anything else, `{}` or a Status from a
// proxy, would otherwise read as a kind with no objects, and the versions
// they name would be deleted. (The dynamic client's own List decodes any
// object as a list with no items.)
func decodePage(body []byte, r resource) (*unstructured.UnstructuredList, error) {
	var head struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Items      json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return nil, fmt.Errorf("the server's answer is not a JSON object: %v", err)
	}
	want := r.gvr.GroupVersion().String()
	if head.APIVersion != want || head.Kind != r.listKind {
		return nil, fmt.Errorf("the server answered %q %q, not a %s %s", head.APIVersion, head.Kind, want, r.listKind)
	}
	if len(head.Items) == 0 || head.Items[0] != '[' {
		return nil, fmt.Errorf("the server answered a %s whose items are not a list", r.listKind)
	}
	var l unstructured.UnstructuredList
	if err := l.UnmarshalJSON(body); err != nil {
		return nil, fmt.Errorf("the server's %s: %v", r.listKind, err)
	}
	return &l, nil
}

// describe adds what bdnvol needs to the server's refusal, and cuts a
// message that quotes a whole answer.
func describe(err error) error {
	msg := err.Error()
	if len(msg) > 512 {
		msg = msg[:512] + "…"
	}
	switch {
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("unauthorized (%s): the kubeconfig's credentials were refused", msg)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("forbidden (%s): bdnvol needs get and list on it in every namespace", msg)
	}
	return errors.New(msg)
}
