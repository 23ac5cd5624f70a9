package clusterpeers

import (
	"crypto/x509"
	"slices"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"time"
)

func ptr[T any](v T) *T { return &v }

type endpoint = struct {
	Addresses  []string `json:"addresses"`
	Conditions struct {
		Ready       *bool `json:"ready"`
		Terminating *bool `json:"terminating"`
	} `json:"conditions"`
}

func slice(typ string, ports map[string]int32, eps ...endpoint) *EndpointSlice {
	s := &EndpointSlice{AddressType: typ, Endpoints: eps}
	for n, p := range ports {
		s.Ports = append(s.Ports, struct {
			Name *string `json:"name"`
			Port *int32  `json:"port"`
		}{ptr(n), ptr(p)})
	}
	return s
}

func ep(ready, terminating *bool, addrs ...string) endpoint {
	var e endpoint
	e.Addresses, e.Conditions.Ready, e.Conditions.Terminating = addrs, ready, terminating
	return e
}

func TestAddresses(t *testing.T) {
	v4 := "IPv4"
	got := Addresses([]*EndpointSlice{
		slice(v4, map[string]int32{"peer": 9809, "metrics": 9808},
			ep(ptr(true), nil, "10.0.0.2"),
			ep(nil, nil, "10.0.0.1"),                     // unknown readiness counts as ready
			ep(ptr(false), nil, "10.0.0.3"),              // not ready
			ep(ptr(true), ptr(true), "10.0.0.4"),         // terminating
			ep(ptr(true), nil, "not-an-ip", "10.0.0.2")), // junk skipped, duplicate merged
		slice("IPv6", map[string]int32{"peer": 9809}, ep(nil, nil, "fd00::5")),
		slice(v4, map[string]int32{"other": 1}, ep(nil, nil, "10.0.0.9")), // no port named peer
		slice(v4, map[string]int32{"peer": 0}, ep(nil, nil, "10.0.0.10")), // a port that is not one
		slice("FQDN", map[string]int32{"peer": 9809}, ep(nil, nil, "a.example")),
		nil,
	}, "peer")
	want := []string{"10.0.0.1:9809", "10.0.0.2:9809", "[fd00::5]:9809"}
	if !slices.Equal(got, want) {
		t.Errorf("Addresses = %v, want %v", got, want)
	}
	if got := Addresses([]*EndpointSlice{slice(v4, map[string]int32{"x": 7}, ep(nil, nil, "10.0.0.1"))}, ""); !slices.Equal(got, []string{"10.0.0.1:7"}) {
		t.Errorf("the only port of a slice: %v", got)
	}
	if got := Addresses([]*EndpointSlice{slice(v4, map[string]int32{"x": 7, "y": 8}, ep(nil, nil, "10.0.0.1"))}, ""); len(got) != 0 {
		t.Errorf("no port name and two ports: %v, want none", got)
	}
}

func TestAddressesBounded(t *testing.T) {
	var eps []endpoint
	for i := range MaxMembers + 50 {
		eps = append(eps, ep(nil, nil, "10."+itoa(i>>16)+"."+itoa(i>>8&255)+"."+itoa(i&255)))
	}
	got := Addresses([]*EndpointSlice{slice("IPv4", map[string]int32{"peer": 1}, eps...)}, "peer")
	if len(got) != MaxMembers || !slices.IsSorted(got) {
		t.Fatalf("%d addresses (sorted %v), want the first %d", len(got), slices.IsSorted(got), MaxMembers)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"[10.0.0.1]:9809": "10.0.0.1:9809",
		"10.0.0.1:9809":   "10.0.0.1:9809",
		"[fd00::5]:1":     "[fd00::5]:1",
		"[FD00:0::5]:1":   "[fd00::5]:1",
	} {
		if got, err := Normalize(in); err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"node-a:9809", "10.0.0.1", ""} {
		if got, err := Normalize(bad); err == nil {
			t.Errorf("Normalize(%q) = %q, want an error", bad, got)
		}
	}
}

func TestCA(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.PEM()
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("a CA's own PEM: %v", err)
	}
	other, _ := NewCA()
	_, otherKey, _ := other.PEM()
	if _, err := ParseCA(certPEM, otherKey); err == nil {
		t.Error("a CA certificate with another CA's key was accepted")
	}
	if _, err := ParseCA([]byte("junk"), keyPEM); err == nil {
		t.Error("junk accepted as a certificate")
	}

	id := &Identity{CA: again, Addr: "10.0.0.7:9809"}
	c, err := id.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("a mounter certificate does not verify against the CA it was read from: %v", err)
	}
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: other.Pool()}); err == nil {
		t.Error("a mounter certificate verified against another CA")
	}
	if len(c.Leaf.IPAddresses) != 1 || c.Leaf.IPAddresses[0].String() != "10.0.0.7" {
		t.Errorf("certificate IPs %v, want 10.0.0.7", c.Leaf.IPAddresses)
	}
	if c2, _ := id.Certificate(); c2 != c {
		t.Error("a fresh certificate was issued again")
	}
	c.Leaf.NotAfter = time.Now().Add(time.Minute) // near its end
	if c3, _ := id.Certificate(); c3 == c {
		t.Error("a certificate near its end was not issued again")
	}
	// A leaf cannot sign: the CA's certificate is the only issuer.
	leafCert := c.Leaf
	if leafCert.IsCA {
		t.Error("a mounter certificate is a CA")
	}
}

// TestSliceOfAPIObject reads an EndpointSlice as the API server sends it.
func TestSliceOfAPIObject(t *testing.T) {
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON([]byte(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",
		"metadata":{"name":"m-abc","namespace":"kube-system","labels":{"kubernetes.io/service-name":"m"}},
		"addressType":"IPv4",
		"endpoints":[{"addresses":["10.1.0.4"],"conditions":{"ready":true,"serving":true,"terminating":false},"nodeName":"n1"},
		             {"addresses":["10.1.0.5"],"conditions":{"ready":false}}],
		"ports":[{"name":"peer","port":9809,"protocol":"TCP"},{"name":"metrics","port":9808}]}`)); err != nil {
		t.Fatal(err)
	}
	s, ok := sliceOf(&u)
	if !ok {
		t.Fatal("not read")
	}
	if got := Addresses([]*EndpointSlice{s}, "peer"); !slices.Equal(got, []string{"10.1.0.4:9809"}) {
		t.Errorf("Addresses = %v", got)
	}
	if _, ok := sliceOf(&struct{}{}); ok {
		t.Error("a foreign object read as a slice")
	}
}
