package source

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"
)

// ErrForbiddenAddress is wrapped when a request of a sync would reach an
// address of the machine's own or internal network (loopback, private,
// link-local, a cloud metadata service) that the options do not allow.
var ErrForbiddenAddress = errors.New("source: refusing to connect to a non-public address")

// netClass is a set of kinds of non-public addresses.
type netClass uint8

const (
	classLoopback  netClass = 1 << iota // 127/8, ::1, unspecified
	classPrivate                        // RFC 1918, ULA, CGNAT 100.64/10, multicast
	classLinkLocal                      // 169.254/16, fe80::/10
	classMetadata                       // cloud instance metadata services
)

func (c netClass) String() string {
	switch {
	case c&classMetadata != 0:
		return "cloud metadata service"
	case c&classLinkLocal != 0:
		return "link-local"
	case c&classLoopback != 0:
		return "loopback"
	case c&classPrivate != 0:
		return "private network"
	}
	return "public"
}

// metadataAddrs are the addresses of cloud instance metadata services
// (AWS, GCP, Azure, OpenStack; AWS's IPv6 one; Alibaba's).
var metadataAddrs = map[netip.Addr]bool{
	netip.MustParseAddr("169.254.169.254"): true,
	netip.MustParseAddr("169.254.170.2"):   true, // ECS task credentials
	netip.MustParseAddr("fd00:ec2::254"):   true,
	netip.MustParseAddr("100.100.100.200"): true,
}

// metadataHosts are names of metadata services, refused by name as well,
// since through an HTTP proxy bdnvol never sees the address.
var metadataHosts = map[string]bool{
	"metadata.google.internal": true, "metadata.goog": true, "metadata": true,
	"instance-data": true, "instance-data.ec2.internal": true,
}

var (
	cgnat = netip.MustParsePrefix("100.64.0.0/10")
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
	zero8 = netip.MustParsePrefix("0.0.0.0/8")
)

// classify returns the kind of a (non-public) address, or 0 for a public
// one. IPv4-mapped and NAT64 addresses are classified by their IPv4 part.
func classify(ip netip.Addr) netClass {
	ip = ip.WithZone("")
	if ip.Is6() && nat64.Contains(ip) {
		b := ip.As16()
		ip = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	ip = ip.Unmap()
	switch {
	case metadataAddrs[ip]:
		return classMetadata | classLinkLocal
	case ip.IsLoopback(), ip.IsUnspecified(), ip.Is4() && zero8.Contains(ip):
		return classLoopback
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return classLinkLocal
	case ip.IsPrivate(), ip.Is4() && cgnat.Contains(ip), ip.IsMulticast(), ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return classPrivate
	}
	return 0
}

// AddressError is a refused destination.
type AddressError struct {
	Host  string     // as the URL or redirect named it
	Addr  netip.Addr // what it resolved to
	class netClass
}

// LinkLocal reports whether the address is link-local (a cloud metadata
// service among them), which Options.AllowLinkLocal allows; any other
// refused address is private, which Options.AllowPrivateNetwork allows.
func (e *AddressError) LinkLocal() bool { return e.class&(classLinkLocal|classMetadata) != 0 }

// Error names the host, the address and its kind.
func (e *AddressError) Error() string {
	at := e.Host
	if e.Addr.IsValid() && e.Addr.String() != e.Host {
		at += " (" + e.Addr.String() + ")"
	}
	return fmt.Sprintf("refusing to connect to %s: a %s address", at, e.class)
}

// Unwrap returns ErrForbiddenAddress.
func (e *AddressError) Unwrap() error { return ErrForbiddenAddress }

// netPolicy decides which addresses the requests of one source may reach,
// at dial time, on every address a name resolves to, so that a redirect or
// a DNS answer that changes between requests cannot lead elsewhere.
//
// Endpoints the user configured (HF_ENDPOINT, an S3 endpoint, a GCS
// emulator) are trusted with the kinds of address they resolve to: an
// endpoint on loopback lets the source's redirects reach loopback too (a
// local mirror and its storage), but not link-local or metadata addresses.
// HTTP proxies from the environment are reached whatever their address.
type netPolicy struct {
	allow     netClass
	lookup    func(ctx context.Context, host string) ([]netip.Addr, error)
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	endpoints []string // hosts of configured endpoints

	once    sync.Once
	implied netClass // the kinds of the endpoints' addresses

	mu      sync.Mutex
	proxies map[string]bool // host:port of proxies the transport used
}

func newNetPolicy(opt Options, endpoints ...*url.URL) *netPolicy {
	p := &netPolicy{lookup: opt.lookup, dial: opt.dial, proxies: map[string]bool{}}
	if opt.AllowPrivateNetwork {
		p.allow |= classLoopback | classPrivate
	}
	if opt.AllowLinkLocal {
		p.allow |= classLinkLocal | classMetadata
	}
	if p.dial == nil {
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		p.dial = d.DialContext
	}
	if p.lookup == nil {
		p.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	for _, u := range endpoints {
		if u != nil && u.Hostname() != "" {
			p.endpoints = append(p.endpoints, u.Hostname())
		}
	}
	return p
}

// check refuses ip (which host named) unless its kind is allowed.
func (p *netPolicy) check(ctx context.Context, host string, ip netip.Addr) error {
	c := classify(ip)
	if c == 0 || c&^p.allow == 0 {
		return nil
	}
	if c&^(p.allow|p.endpointClasses(ctx)) == 0 {
		return nil
	}
	return &AddressError{Host: host, Addr: ip, class: c &^ p.allow}
}

// endpointClasses resolves the configured endpoints once and returns the
// kinds of their addresses.
func (p *netPolicy) endpointClasses(ctx context.Context) netClass {
	p.once.Do(func() {
		for _, h := range p.endpoints {
			ips := []netip.Addr{}
			if ip, err := netip.ParseAddr(h); err == nil {
				ips = append(ips, ip)
			} else {
				lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				ips, _ = p.lookup(lctx, h)
				cancel()
			}
			for _, ip := range ips {
				p.implied |= classify(ip)
			}
		}
	})
	return p.implied
}

// checkURL refuses a request whose URL names a forbidden address literally
// or a metadata service by name, before anything is dialed (and when the
// request goes through a proxy, which resolves names itself).
func (p *netPolicy) checkURL(ctx context.Context, u *url.URL) error {
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if ip, err := netip.ParseAddr(host); err == nil {
		return p.check(ctx, host, ip)
	}
	if metadataHosts[host] && p.allow&classMetadata == 0 {
		return &AddressError{Host: host, class: classMetadata | classLinkLocal}
	}
	return nil
}

// proxy wraps a transport's Proxy function to remember the proxies used.
func (p *netPolicy) proxy(f func(*http.Request) (*url.URL, error)) func(*http.Request) (*url.URL, error) {
	if f == nil {
		return nil
	}
	return func(req *http.Request) (*url.URL, error) {
		u, err := f(req)
		if u != nil && err == nil {
			port := u.Port()
			if port == "" {
				port = map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}[u.Scheme]
			}
			p.mu.Lock()
			p.proxies[net.JoinHostPort(u.Hostname(), port)] = true
			p.mu.Unlock()
		}
		return u, err
	}
}

// dialContext resolves addr, refuses it when any of its addresses is
// forbidden, and dials the checked addresses themselves (never the name
// again, so a second DNS answer cannot differ from the one checked).
func (p *netPolicy) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	p.mu.Lock()
	isProxy := p.proxies[addr]
	p.mu.Unlock()
	if isProxy {
		return p.dial(ctx, network, addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else {
		if metadataHosts[strings.TrimSuffix(strings.ToLower(host), ".")] && p.allow&classMetadata == 0 {
			return nil, &AddressError{Host: host, class: classMetadata | classLinkLocal}
		}
		ips, err = p.lookup(ctx, host)
		if err != nil {
			return nil, err
		}
		if len(ips) == 0 {
			return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
		}
	}
	for _, ip := range ips {
		if err := p.check(ctx, host, ip); err != nil {
			return nil, err
		}
	}
	var firstErr error
	for _, ip := range ips {
		c, err := p.dial(ctx, network, net.JoinHostPort(ip.String(), port))
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

// guardTransport checks each request's URL (the first and every redirect)
// before handing it to base.
type guardTransport struct {
	p    *netPolicy
	base http.RoundTripper
}

func (t *guardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.p.checkURL(req.Context(), req.URL); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	return t.base.RoundTrip(req)
}

// transport returns the RoundTripper a source's requests go through: opt's
// Transport if set (checked by URL only), else a clone of
// http.DefaultTransport that dials through the policy.
func (p *netPolicy) transport(opt Options) http.RoundTripper {
	if opt.Transport != nil {
		return &guardTransport{p: p, base: opt.Transport}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 32
	tr.Proxy = p.proxy(tr.Proxy)
	tr.DialContext = p.dialContext
	return &guardTransport{p: p, base: tr}
}
