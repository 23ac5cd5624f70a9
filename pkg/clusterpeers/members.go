package clusterpeers

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// MaxMembers bounds the addresses a membership holds: more are dropped
// (the lowest in sort order are kept, so every node drops the same ones).
const MaxMembers = 10000

// ServiceNameLabel is the label that ties an EndpointSlice to its Service.
const ServiceNameLabel = "kubernetes.io/service-name"

// endpointSlices is the discovery.k8s.io/v1 resource of EndpointSlices.
var endpointSlices = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}

// EndpointSlice holds the fields of a discovery.k8s.io/v1 EndpointSlice
// that membership reads (the API types are not imported: they would add
// every API group to the binary).
type EndpointSlice struct {
	AddressType string `json:"addressType"`
	Endpoints   []struct {
		Addresses  []string `json:"addresses"`
		Conditions struct {
			Ready       *bool `json:"ready"`
			Terminating *bool `json:"terminating"`
		} `json:"conditions"`
	} `json:"endpoints"`
	Ports []struct {
		Name *string `json:"name"`
		Port *int32  `json:"port"`
	} `json:"ports"`
}

// sliceOf reads an EndpointSlice of the API server's answer.
func sliceOf(o any) (*EndpointSlice, bool) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, false
	}
	var s EndpointSlice
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
		return nil, false
	}
	return &s, true
}

// Addresses returns the distinct host:port addresses, sorted, of the ready
// endpoints of slices on the port named port (a slice's only port when
// port is ""), at most MaxMembers. An endpoint whose readiness is unknown
// counts as ready, as the EndpointSlice API defines; a terminating one
// does not.
func Addresses(slices_ []*EndpointSlice, port string) []string {
	seen := map[string]bool{}
	for _, s := range slices_ {
		if s == nil || (s.AddressType != "IPv4" && s.AddressType != "IPv6") {
			continue
		}
		p, ok := slicePort(s, port)
		if !ok {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
				continue
			}
			for _, a := range e.Addresses {
				ip := net.ParseIP(a)
				if ip == nil {
					continue
				}
				seen[net.JoinHostPort(ip.String(), strconv.Itoa(int(p)))] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for a := range seen {
		out = append(out, a)
	}
	slices.Sort(out)
	if len(out) > MaxMembers {
		out = out[:MaxMembers]
	}
	return out
}

// slicePort is the number of s's port named name, or of its only port when
// name is "".
func slicePort(s *EndpointSlice, name string) (int32, bool) {
	var found *struct {
		Name *string `json:"name"`
		Port *int32  `json:"port"`
	}
	for i := range s.Ports {
		p := &s.Ports[i]
		n := ""
		if p.Name != nil {
			n = *p.Name
		}
		if name == "" && len(s.Ports) == 1 || name != "" && n == name {
			found = p
			break
		}
	}
	if found == nil || found.Port == nil || *found.Port <= 0 || *found.Port > 65535 {
		return 0, false
	}
	return *found.Port, true
}

// Normalize returns addr (host:port, the host an IP address, bracketed or
// not) in the form Addresses gives, so that a node finds itself among its
// Service's endpoints.
func Normalize(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return "", fmt.Errorf("%q: the peer address must be an IP address, as EndpointSlices give them", addr)
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// Watch calls set with the ready addresses of the endpoints of the Service
// namespace/service on its port named port (see Addresses): once the first
// list has arrived and again on every change, until ctx ends. client-go's
// reflector lists and watches the Service's EndpointSlices, and relists
// after an error (logged by logf) with backoff. Watch returns once the
// watch is started; set is never called concurrently with itself.
func Watch(ctx context.Context, cfg *rest.Config, namespace, service, port string, set func([]string), logf func(string, ...any)) error {
	if namespace == "" || service == "" {
		return fmt.Errorf("the Service must be named NAMESPACE/NAME")
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("EndpointSlices client: %w", err)
	}
	client := dyn.Resource(endpointSlices).Namespace(namespace)
	selector := ServiceNameLabel + "=" + service
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			return client.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return client.Watch(ctx, o)
		},
	}
	var store cache.Store
	last := []string(nil)
	update := func() {
		var ss []*EndpointSlice
		for _, o := range store.List() {
			if s, ok := sliceOf(o); ok {
				ss = append(ss, s)
			}
		}
		addrs := Addresses(ss, port)
		if last != nil && slices.Equal(addrs, last) {
			return
		}
		last = addrs
		set(addrs)
	}
	// Handlers run on one goroutine, the informer's: set is never called
	// concurrently with itself.
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { update() },
		UpdateFunc: func(any, any) { update() },
		DeleteFunc: func(any) { update() },
	}
	var ctl cache.Controller
	store, ctl = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &unstructured.Unstructured{},
		Handler:       h,
	})
	go ctl.RunWithContext(ctx)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), ctl.HasSynced) {
			return
		}
		if len(store.List()) == 0 && logf != nil {
			logf("no EndpointSlice of Service %s/%s yet", namespace, service)
		}
	}()
	return nil
}
