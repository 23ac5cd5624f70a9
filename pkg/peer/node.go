package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
)

// Config configures a Node: the peer tier of one process (a `bdnvol pull`
// that joins its peers for its duration).
type Config struct {
	// Listen is the host:port the peer server listens on.
	Listen string
	// Advertise is this node's address as its peers reach it (and as
	// Peers lists it); "" means Listen.
	Advertise string
	// Peers are the other nodes' addresses, host:port each (this node's
	// own may be among them).
	Peers []string
	// TLSDir holds ca.crt, tls.crt and tls.key: mutual TLS between nodes
	// (certificates of one CA); see LoadTLS.
	TLSDir string
	// Insecure allows plain HTTP between nodes when TLSDir is "".
	Insecure bool
}

// Node is a running peer tier: a Server over a cache on its own listener,
// a Ring, and the client its Fetchers ask peers with.
type Node struct {
	Ring   *Ring
	Server *Server
	// Stats count what this node's fetchers read, by source.
	Stats *Stats

	client *http.Client
	scheme string
	hs     *http.Server
}

// Start starts the peer server of c over cache (the whole cache: it serves
// each origin's view) and returns the node.
func Start(c Config, cache *chunkcache.Cache) (*Node, error) {
	if c.Listen == "" {
		return nil, errors.New("the peer tier needs a listening address")
	}
	if c.TLSDir == "" && !c.Insecure {
		return nil, errors.New("the peer tier needs a TLS directory (ca.crt, tls.crt, tls.key) or an explicit choice of plain HTTP")
	}
	self := c.Advertise
	if self == "" {
		self = c.Listen
	}
	ring := NewRing(self)
	ring.Set(c.Peers)
	// Its peers start together: until it has read the version, it holds
	// their requests rather than refusing them.
	// So do the peers: until then one that refuses connections is
	// starting, and asked again.
	srv := &Server{Cache: cache, Ring: ring, AwaitUntil: time.Now().Add(openWait)}
	ring.AwaitStart(srv.AwaitUntil)
	n := &Node{Ring: ring, Server: srv, Stats: new(Stats), scheme: "http"}
	tr := &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}
	n.client = &http.Client{Transport: tr}
	n.hs = &http.Server{Handler: n.Server, ReadHeaderTimeout: 10 * time.Second}
	if c.TLSDir != "" {
		sc, cc, err := LoadTLS(c.TLSDir)
		if err != nil {
			return nil, fmt.Errorf("peer TLS: %w", err)
		}
		n.hs.TLSConfig, tr.TLSClientConfig, n.scheme = sc, cc, "https"
	}
	l, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, fmt.Errorf("peer server: %w", err)
	}
	if n.hs.TLSConfig != nil {
		l = tls.NewListener(l, n.hs.TLSConfig)
	}
	go n.hs.Serve(l)
	return n, nil
}

// Fetcher returns the fetcher of the chunks of registry/repo through the
// peers before src; while it is open, this node fetches through it for its
// peers the chunks it owns of the versions opened through it
// (Fetcher.Opened), until Fetcher.Close.
func (n *Node) Fetcher(registry, repo string, src content.Fetcher) *Fetcher {
	f := NewFetcher(n.Ring, registry, repo, src, Options{Client: n.client, Scheme: n.scheme, Stats: n.Stats})
	f.OnClose(n.Server.Serve(registry+"/"+repo, f.ForPeers(), f.Known))
	return f
}

// Linger keeps serving until no peer request came for idle, max passed or
// ctx ended: a node that finished stays while its peers still ask it for
// the chunks it holds.
func (n *Node) Linger(ctx context.Context, idle, max time.Duration) {
	start := time.Now()
	end := start.Add(max)
	t := time.NewTicker(min(idle, 100*time.Millisecond) + time.Millisecond)
	defer t.Stop()
	quiet := func() bool {
		last := n.Server.LastRequest()
		if last.Before(start) {
			last = start
		}
		return time.Since(last) >= idle
	}
	for time.Now().Before(end) && !quiet() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close stops the server.
func (n *Node) Close() error { return n.hs.Close() }

// LoadTLS loads the mutual TLS configuration of dir (ca.crt, tls.crt,
// tls.key; see TLS): each side presents the CA's node certificate and
// checks the other's chain against the CA, not its name (peers are
// addressed by IP).
func LoadTLS(dir string) (server, client *tls.Config, err error) {
	var t TLS
	if err := t.LoadDir(dir); err != nil {
		return nil, nil, err
	}
	server, client = t.Configs()
	return server, client, nil
}
