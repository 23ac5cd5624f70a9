package csi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/clusterpeers"
	"github.com/bdnvol/bdnvol/pkg/kubeclient"
	"github.com/bdnvol/bdnvol/pkg/metrics"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/peer"
	"k8s.io/client-go/rest"
)

// PeerConfig configures the mounter's peer tier (pkg/peer).
type PeerConfig struct {
	// Listen is the host:port the peer server listens on; "" turns the
	// tier off.
	Listen string
	// Advertise is this node's address as its peers reach it (and as
	// Peers or the Service's endpoints list it); "" means Listen.
	Advertise string
	// Peers are the cluster's mounters, host:port each (a static
	// membership; this node's own address may be among them).
	Peers []string
	// Service ("NAMESPACE/NAME") is the mounters' headless Service: the
	// membership is the ready endpoints of its EndpointSlices on the port
	// named PortName, watched through the Kubernetes API.
	Service  string
	PortName string
	// TLSDir holds ca.crt, tls.crt and tls.key: every mounter's certificate
	// of one cluster CA, for mutual TLS between mounters.
	TLSDir string
	// TLSSecret ("NAMESPACE/NAME") is the Secret that holds the cluster CA
	// (made by the first mounter when it is empty); each mounter issues
	// its own certificate of it.
	TLSSecret string
	// Insecure allows plain HTTP between mounters when neither TLSDir nor
	// TLSSecret is given (a test, or a node network the operator vouches
	// for).
	Insecure bool
}

// splitName splits "NAMESPACE/NAME".
func splitName(flag, s string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%s %q: want NAMESPACE/NAME", flag, s)
	}
	return ns, name, nil
}

// startPeers starts the peer tier of c over cache and returns the hook that
// puts the peers in front of a mount's registry source. With a TLS Secret
// or a Service, what needs the API server (the CA, then the membership)
// comes in the background, retried until it works: until then the ring is
// empty and every fetch goes to the registry.
func startPeers(ctx context.Context, c PeerConfig, cache *chunkcache.Cache, met *metrics.Metrics, log *slog.Logger) (func(oci.Ref, content.Fetcher) content.Fetcher, error) {
	tlsModes := 0
	for _, on := range []bool{c.TLSDir != "", c.TLSSecret != "", c.Insecure} {
		if on {
			tlsModes++
		}
	}
	switch {
	case tlsModes == 0:
		return nil, errors.New("the peer tier needs --peer-tls-secret, --peer-tls-dir (ca.crt, tls.crt, tls.key) or an explicit choice of plain HTTP (--peer-insecure)")
	case tlsModes > 1:
		return nil, errors.New("--peer-tls-secret, --peer-tls-dir and --peer-insecure exclude one another")
	case c.Service != "" && len(c.Peers) > 0:
		return nil, errors.New("--peers and --peer-service exclude one another")
	}
	self := c.Advertise
	if self == "" {
		self = c.Listen
	}
	if c.Service != "" {
		n, err := clusterpeers.Normalize(self)
		if err != nil {
			return nil, fmt.Errorf("--peer-advertise: %w", err)
		}
		self = n
	}
	var svcNS, svcName, secNS, secName string
	var err error
	if c.Service != "" {
		if svcNS, svcName, err = splitName("--peer-service", c.Service); err != nil {
			return nil, err
		}
	}
	if c.TLSSecret != "" {
		if secNS, secName, err = splitName("--peer-tls-secret", c.TLSSecret); err != nil {
			return nil, err
		}
	}
	ring := peer.NewRing(self)
	srv := &peer.Server{Cache: cache, Ring: ring}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}}
	scheme := "http"
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	st := &peer.TLS{}
	if c.TLSDir != "" || c.TLSSecret != "" {
		scheme = "https"
		var cc *tls.Config
		hs.TLSConfig, cc = st.Configs()
		client.Transport.(*http.Transport).TLSClientConfig = cc
	}
	if c.TLSDir != "" {
		if err := st.LoadDir(c.TLSDir); err != nil {
			return nil, fmt.Errorf("peer TLS: %w", err)
		}
	}
	l, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, fmt.Errorf("peer server: %w", err)
	}
	var kube *kubeclientConfig
	if c.Service != "" || c.TLSSecret != "" {
		cfg, name, err := kubeclient.Config(ctx, "")
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("peer tier: the Kubernetes API: %w", err)
		}
		kube = &kubeclientConfig{cfg: cfg, name: name}
	}
	go func() {
		<-ctx.Done()
		hs.Close()
		l.Close()
	}()
	var members atomic.Int64
	stats := new(peer.Stats)
	met.Peers(func() metrics.PeerSample {
		s := srv.Stats()
		return metrics.PeerSample{FromPeers: stats.PeerBytes.Load(), FromSource: stats.SourceBytes.Load(),
			ServedToPeers: s.ServedBytes, PeerFailures: stats.PeerFailures.Load(), Refused: s.Refused,
			Members: members.Load()}
	})
	setMembers := func(addrs []string) {
		ring.Set(addrs)
		members.Store(int64(len(ring.Members())))
		log.Info("peer membership", "members", len(addrs))
	}
	// start serves and sets the membership, once the TLS identity is known.
	start := func() {
		if hs.TLSConfig != nil {
			go hs.Serve(tls.NewListener(l, hs.TLSConfig))
		} else {
			go hs.Serve(l)
		}
		if c.Service == "" {
			setMembers(c.Peers)
		} else {
			for attempt := 0; ; attempt++ {
				err := clusterpeers.Watch(ctx, kube.cfg, svcNS, svcName, c.PortName, setMembers,
					func(f string, a ...any) { log.Warn(fmt.Sprintf(f, a...)) })
				if err == nil || !sleepBackoff(ctx, attempt) {
					if err != nil {
						log.Error("peer membership", "err", err)
					}
					break
				}
				log.Warn("peer membership: retrying", "service", c.Service, "err", err)
			}
		}
		log.Info("peer tier on", "listen", c.Listen, "self", self, "peers", len(ring.Members()), "tls", hs.TLSConfig != nil,
			"service", c.Service, "kube", kube.String())
	}
	if c.TLSSecret == "" {
		start()
	} else {
		go func() {
			for attempt := 0; ; attempt++ {
				ca, err := clusterpeers.LoadOrCreateCA(ctx, kube.cfg, secNS, secName)
				if err == nil {
					id := &clusterpeers.Identity{CA: ca, Addr: self}
					st.SetCA(ca.Pool(), id.Certificate)
					start()
					return
				}
				log.Warn("peer tier waits for its CA", "secret", c.TLSSecret, "err", err)
				if !sleepBackoff(ctx, attempt) {
					return
				}
			}
		}()
	}
	return func(ref oci.Ref, src content.Fetcher) content.Fetcher {
		f := peer.NewFetcher(ring, ref.Registry, ref.Repository, src, peer.Options{Client: client, Scheme: scheme, Stats: stats})
		// This node fetches for its peers the chunks it owns of the
		// versions the mount opened, until the mount ends (f.Close): from
		// the peer that fetched one before (a hint), else the registry.
		f.OnClose(srv.Serve(ref.Repo(), f.ForPeers(), f.Known))
		return f
	}, nil
}

// kubeclientConfig is the API server configuration the peer tier uses, and
// its name for the log.
type kubeclientConfig struct {
	cfg  *rest.Config
	name string
}

func (k *kubeclientConfig) String() string {
	if k == nil {
		return ""
	}
	return k.name
}

// sleepBackoff waits before retry attempt+1 (1 s doubling to a minute) and
// reports whether ctx is still live.
func sleepBackoff(ctx context.Context, attempt int) bool {
	d := time.Second << min(attempt, 6)
	if d > time.Minute {
		d = time.Minute
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
