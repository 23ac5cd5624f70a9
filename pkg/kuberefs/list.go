package kuberefs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Scheme is the prefix of a cluster reference source: k8s:// for the
// current context (or the pod's own cluster), k8s://CONTEXT for another.
const Scheme = "k8s://"

// Resources are the lists read, by API path: every kind whose objects can
// name a volume (an inline CSI volume in a pod template, a persistent
// volume's attributes, the warm list's config map).
var Resources = []string{
	"/api/v1/pods",
	"/api/v1/persistentvolumes",
	"/api/v1/configmaps",
	"/apis/apps/v1/deployments",
	"/apis/apps/v1/statefulsets",
	"/apis/apps/v1/daemonsets",
	"/apis/apps/v1/replicasets",
	"/apis/batch/v1/jobs",
	"/apis/batch/v1/cronjobs",
}

// Bounds of a read: objects per page, bytes per page, pages per list.
const (
	pageLimit    = 500
	maxPageBytes = 64 << 20
	maxPages     = 10000
)

// ErrNotCluster is returned by Open for a source that is not a k8s:// one.
var ErrNotCluster = errors.New("not a k8s:// source")

// Cluster reads the objects of one cluster.
type Cluster struct {
	ep *endpoint
	hc *http.Client
}

// IsSource reports whether s names a cluster (k8s://[CONTEXT]).
func IsSource(s string) bool { return strings.HasPrefix(s, Scheme) }

// Open returns the cluster that source (k8s:// or k8s://CONTEXT) names:
// the context from the kubeconfig files (KUBECONFIG, else ~/.kube/config),
// or, for k8s:// with no kubeconfig, the pod's own cluster through its
// service account.
func Open(source string) (*Cluster, error) {
	if !IsSource(source) {
		return nil, ErrNotCluster
	}
	name := strings.TrimPrefix(source, Scheme)
	kc, found, err := loadKubeconfig(kubeconfigPaths())
	if err != nil {
		return nil, err
	}
	var ep *endpoint
	switch {
	case found:
		ep, err = fromKubeconfig(kc, name)
	case name == "":
		ep, err = inCluster()
	default:
		err = fmt.Errorf("context %q: no kubeconfig (KUBECONFIG or ~/.kube/config)", name)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = ep.tls
	return &Cluster{ep: ep, hc: &http.Client{Transport: tr, Timeout: 2 * time.Minute}}, nil
}

// Name is the source as its references name it: k8s://CONTEXT.
func (c *Cluster) Name() string { return Scheme + c.ep.name }

// Objects calls visit with every object of Resources, as JSON, and a name
// for it (k8s://CONTEXT/RESOURCE/NAMESPACE/NAME). Any list it cannot read
// in full fails the call.
func (c *Cluster) Objects(ctx context.Context, visit func(name string, obj []byte) error) error {
	for _, res := range Resources {
		if err := c.list(ctx, res, visit); err != nil {
			return err
		}
	}
	return nil
}

// listPage is a list response, with items left as JSON.
type listPage struct {
	Metadata struct {
		Continue string `json:"continue"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

type objectMeta struct {
	Metadata struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"metadata"`
}

// list reads one resource page by page.
func (c *Cluster) list(ctx context.Context, res string, visit func(string, []byte) error) error {
	kind := res[strings.LastIndexByte(res, '/')+1:]
	seen := map[string]bool{}
	cont := ""
	for page := 0; ; page++ {
		if page == maxPages {
			return fmt.Errorf("%s: listing %s: more than %d pages", c.Name(), kind, maxPages)
		}
		p, err := c.page(ctx, res, cont)
		if err != nil {
			return fmt.Errorf("%s: listing %s: %w", c.Name(), kind, err)
		}
		for _, it := range p.Items {
			var m objectMeta
			if err := json.Unmarshal(it, &m); err != nil {
				return fmt.Errorf("%s: listing %s: an item is not an object: %v", c.Name(), kind, err)
			}
			name := c.Name() + "/" + kind + "/"
			if m.Metadata.Namespace != "" {
				name += m.Metadata.Namespace + "/"
			}
			if err := visit(name+m.Metadata.Name, it); err != nil {
				return err
			}
		}
		cont = p.Metadata.Continue
		if cont == "" {
			return nil
		}
		if seen[cont] {
			return fmt.Errorf("%s: listing %s: the server repeats a continue token", c.Name(), kind)
		}
		seen[cont] = true
	}
}

// page fetches one page of res.
func (c *Cluster) page(ctx context.Context, res, cont string) (*listPage, error) {
	q := url.Values{"limit": {fmt.Sprint(pageLimit)}}
	if cont != "" {
		q.Set("continue", cont)
	}
	u := *c.ep.server
	u.Path = strings.TrimSuffix(u.Path, "/") + res
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "bdnvol")
	if c.ep.token != nil {
		tok, err := c.ep.token(ctx)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	} else if c.ep.basic[0] != "" {
		req.SetBasicAuth(c.ep.basic[0], c.ep.basic[1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPageBytes+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp.StatusCode, body)
	}
	if len(body) > maxPageBytes {
		return nil, fmt.Errorf("a page is larger than %d bytes", maxPageBytes)
	}
	var p listPage
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, fmt.Errorf("not a list: %v", err)
	}
	return &p, nil
}

// statusError describes a failed list from the server's Status message.
func statusError(code int, body []byte) error {
	var st struct {
		Message string `json:"message"`
	}
	msg := http.StatusText(code)
	if json.Unmarshal(body, &st) == nil && st.Message != "" {
		msg = st.Message
		if len(msg) > 512 {
			msg = msg[:512] + "…"
		}
	}
	switch code {
	case http.StatusUnauthorized:
		return fmt.Errorf("unauthorized (%s): the kubeconfig's credentials were refused", msg)
	case http.StatusForbidden:
		return fmt.Errorf("forbidden (%s): bdnvol needs get and list on it in every namespace", msg)
	}
	return fmt.Errorf("HTTP %d: %s", code, msg)
}
