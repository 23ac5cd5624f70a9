package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is an HTTP server on loopback that counts the
// connections it accepts: the internal service a redirect aims at.
type countingServer struct {
	ln      net.Listener
	accepts atomic.Int64
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func newCountingServer(t *testing.T, h http.Handler) *countingServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &countingServer{ln: ln}
	srv := &http.Server{Handler: h}
	go srv.Serve(countingListener{ln, &s.accepts})
	t.Cleanup(func() { srv.Close() })
	return s
}

// fakeNet stands in for DNS and routing: names resolve to what resolve
// says, dials to the addresses in routes go to local listeners, and other
// dials fail unless they are to loopback. Every
// address the policy let through to the dialer is recorded.
type fakeNet struct {
	resolve func(host string) []netip.Addr
	routes  map[string]string // "IP:port" -> local "host:port"

	mu     sync.Mutex
	dialed []string
}

func (f *fakeNet) apply(opt Options) Options {
	opt.lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
		if ips := f.resolve(host); ips != nil {
			return ips, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	opt.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		f.mu.Lock()
		f.dialed = append(f.dialed, addr)
		f.mu.Unlock()
		if to, ok := f.routes[addr]; ok {
			addr = to
		} else if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().IsLoopback() {
			// Never reach a real address (this machine may have a
			// metadata service), even when the policy is broken.
			return nil, fmt.Errorf("test network: no route to %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	return opt
}

func (f *fakeNet) dials() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.dialed...)
}

const credentials = `{"AccessKeyId":"ASIAEXAMPLE","SecretAccessKey":"instance-role-secret"}`

// A source on a public address that redirects to the metadata service (or a
// list that names it) is refused before anything connects to it; with
// --allow-link-local the same setup seals the credentials, which is what
// every sync did before the policy.
func TestRedirectToMetadataRefusedBeforeConnecting(t *testing.T) {
	metadata := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, credentials)
	}))
	const md = "http://169.254.169.254/latest/meta-data/iam/security-credentials/node-role"
	source := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/model.bin":
			http.Redirect(w, r, md, http.StatusFound)
		case "/list.txt":
			fmt.Fprintf(w, "%s creds.json\n", md)
		case "/list-by-name.txt":
			fmt.Fprintln(w, "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token token.json")
		default:
			http.NotFound(w, r)
		}
	}))
	defer source.Close()
	fn := &fakeNet{
		resolve: func(host string) []netip.Addr {
			switch host {
			case "models.example":
				return []netip.Addr{netip.MustParseAddr("203.0.113.7")}
			case "metadata.google.internal":
				return []netip.Addr{netip.MustParseAddr("169.254.169.254")}
			}
			return nil
		},
		routes: map[string]string{
			"203.0.113.7:80":     source.Listener.Addr().String(),
			"169.254.169.254:80": metadata.ln.Addr().String(),
		},
	}
	for _, tc := range []struct {
		name, uri string
		list      bool
	}{
		{"redirect", "http://models.example/model.bin", false},
		{"list entry", "http://models.example/list.txt", true},
		{"list entry by name", "http://models.example/list-by-name.txt", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fn.mu.Lock()
			fn.dialed = nil
			fn.mu.Unlock()
			opt := fn.apply(testOpts)
			opt.List = tc.list
			src, err := Open(context.Background(), tc.uri, opt)
			if err != nil {
				t.Fatal(err)
			}
			_, err = pushSource(t, src)
			if !errors.Is(err, ErrForbiddenAddress) {
				t.Fatalf("push: %v, want the metadata address refused", err)
			}
			var addr *AddressError
			if !strings.Contains(err.Error(), "cloud metadata service") || !errors.As(err, &addr) || !addr.LinkLocal() {
				t.Errorf("error %q does not say a link-local metadata address", err)
			}
			if n := metadata.accepts.Load(); n != 0 {
				t.Fatalf("the metadata service accepted %d connections", n)
			}
			for _, a := range fn.dials() {
				if strings.HasPrefix(a, "169.254.") {
					t.Fatalf("dialed %s", a)
				}
			}

			// The control: allowed, the same source seals the credentials.
			opt.AllowLinkLocal = true
			src, err = Open(context.Background(), tc.uri, opt)
			if err != nil {
				t.Fatal(err)
			}
			res, err := pushSource(t, src)
			if err != nil {
				t.Fatalf("push with --allow-link-local: %v", err)
			}
			if metadata.accepts.Load() == 0 || res.Index.Len() != 1 || res.Index.File(0).Size != int64(len(credentials)) {
				t.Fatalf("the control did not reach the metadata service (%d connections)", metadata.accepts.Load())
			}
			metadata.accepts.Store(0)
		})
	}
}

// A Hub on loopback (HF_ENDPOINT) may redirect to a CDN on loopback, as a
// local mirror does, but not to the metadata service.
func TestHubRedirectToMetadataRefused(t *testing.T) {
	metadata := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, credentials)
	}))
	files, lfs := hubFiles()
	hub := newFakeHub(t, files, lfs)
	hub.cdnBase = "http://169.254.169.254"
	t.Setenv("HF_ENDPOINT", hub.hub.URL)
	fn := &fakeNet{resolve: func(string) []netip.Addr { return nil },
		routes: map[string]string{"169.254.169.254:80": metadata.ln.Addr().String()}}
	src, err := Open(context.Background(), "hf://org/repo", fn.apply(testOpts))
	if err != nil {
		t.Fatal(err)
	}
	_, err = pushSource(t, src)
	if !errors.Is(err, ErrForbiddenAddress) || !strings.Contains(err.Error(), "169.254.169.254") {
		t.Fatalf("push: %v, want the redirect to 169.254.169.254 refused", err)
	}
	if n := metadata.accepts.Load(); n != 0 {
		t.Fatalf("the metadata service accepted %d connections", n)
	}
}

// An S3-compatible endpoint on loopback (--endpoint) that redirects an
// object's GET to the metadata service is refused too.
func TestS3RedirectToMetadataRefused(t *testing.T) {
	metadata := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, credentials)
	}))
	s3 := newFakeS3(t, map[string]int64{"data/a.bin": int64(len(credentials))})
	s3.redirect = "http://169.254.169.254/latest/meta-data/iam/security-credentials/node-role"
	fn := &fakeNet{resolve: func(string) []netip.Addr { return nil },
		routes: map[string]string{"169.254.169.254:80": metadata.ln.Addr().String()}}
	opt := fn.apply(testOpts)
	opt.Endpoint = s3.srv.URL
	start := time.Now()
	src, err := Open(context.Background(), "s3://b/data", opt)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pushSource(t, src)
	if !errors.Is(err, ErrForbiddenAddress) {
		t.Fatalf("push: %v, want the redirect to the metadata service refused", err)
	}
	if n := metadata.accepts.Load(); n != 0 {
		t.Fatalf("the metadata service accepted %d connections", n)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the refusal took %v: it was retried", d)
	}
	opt.AllowLinkLocal = true // the control
	if src, err = Open(context.Background(), "s3://b/data", opt); err != nil {
		t.Fatal(err)
	}
	if _, err = pushSource(t, src); err != nil || metadata.accepts.Load() == 0 {
		t.Fatalf("push with --allow-link-local: %v (%d connections)", err, metadata.accepts.Load())
	}
}

// A name that resolves to a public address and then, for a later request,
// to loopback or link-local (DNS rebinding) is refused when it does: the
// check is made on the addresses dialed, not once per name.
func TestDNSRebindingRefusedAtDialTime(t *testing.T) {
	body := randBytes(9, 300<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close") // every request dials again
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
	}))
	defer srv.Close()
	public := netip.MustParseAddr("203.0.113.9")
	for _, tc := range []struct {
		name  string
		later []netip.Addr
	}{
		{"loopback", []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		{"link-local", []netip.Addr{netip.MustParseAddr("169.254.169.254")}},
		{"mapped link-local", []netip.Addr{netip.MustParseAddr("::ffff:169.254.169.254")}},
		{"mixed answer", []netip.Addr{public, netip.MustParseAddr("10.0.0.5")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lookups atomic.Int64
			fn := &fakeNet{
				resolve: func(host string) []netip.Addr {
					if host != "rebind.example" {
						return nil
					}
					if lookups.Add(1) == 1 {
						return []netip.Addr{public}
					}
					return tc.later
				},
				routes: map[string]string{"203.0.113.9:80": srv.Listener.Addr().String()},
			}
			src, err := Open(context.Background(), "http://rebind.example/model.bin", fn.apply(testOpts))
			if err != nil {
				t.Fatal(err)
			}
			_, err = pushSource(t, src)
			if !errors.Is(err, ErrForbiddenAddress) {
				t.Fatalf("push: %v, want the rebound address refused", err)
			}
			if lookups.Load() < 2 {
				t.Fatalf("%d lookups: the test did not rebind", lookups.Load())
			}
			for _, a := range fn.dials() {
				if a != "203.0.113.9:80" {
					t.Fatalf("dialed %s after the name was rebound", a)
				}
			}
		})
	}
}

func TestClassify(t *testing.T) {
	for in, want := range map[string]netClass{
		"8.8.8.8": 0, "203.0.113.9": 0, "2606:4700::1111": 0, "100.128.0.1": 0,
		"127.0.0.1": classLoopback, "127.9.9.9": classLoopback, "::1": classLoopback,
		"0.0.0.0": classLoopback, "::": classLoopback, "::ffff:127.0.0.1": classLoopback,
		"10.1.2.3": classPrivate, "172.16.0.1": classPrivate, "192.168.1.1": classPrivate,
		"fd12::1": classPrivate, "100.64.0.1": classPrivate, "100.127.255.254": classPrivate,
		"169.254.1.1": classLinkLocal, "fe80::1": classLinkLocal, "fe80::1%eth0": classLinkLocal,
		"169.254.169.254": classMetadata | classLinkLocal, "fd00:ec2::254": classMetadata | classLinkLocal,
		"::ffff:169.254.169.254": classMetadata | classLinkLocal, "64:ff9b::a9fe:a9fe": classMetadata | classLinkLocal,
		"100.100.100.200": classMetadata | classLinkLocal,
	} {
		if got := classify(netip.MustParseAddr(in)); got != want {
			t.Errorf("classify(%s) = %v (%d), want %v (%d)", in, got, got, want, want)
		}
	}
	opt := Options{AllowPrivateNetwork: true}
	p := newNetPolicy(opt)
	if p.check(context.Background(), "x", netip.MustParseAddr("10.0.0.1")) != nil ||
		p.check(context.Background(), "x", netip.MustParseAddr("169.254.169.254")) == nil {
		t.Error("--allow-private-network does not allow private but not metadata addresses")
	}
	p = newNetPolicy(Options{AllowLinkLocal: true})
	if p.check(context.Background(), "x", netip.MustParseAddr("169.254.169.254")) != nil ||
		p.check(context.Background(), "x", netip.MustParseAddr("127.0.0.1")) == nil {
		t.Error("--allow-link-local does not allow metadata but not loopback addresses")
	}
}
