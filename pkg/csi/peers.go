package csi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/metrics"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/peer"
)

// PeerConfig configures the mounter's peer tier (pkg/peer).
type PeerConfig struct {
	// Listen is the host:port the peer server listens on; "" turns the
	// tier off.
	Listen string
	// Advertise is this node's address as its peers reach it (and as
	// Peers lists it); "" means Listen.
	Advertise string
	// Peers are the cluster's mounters, host:port each (a static
	// membership; this node's own address may be among them).
	Peers []string
	// TLSDir holds ca.crt, tls.crt and tls.key: every mounter's certificate
	// of one cluster CA, for mutual TLS between mounters.
	TLSDir string
	// Insecure allows plain HTTP between mounters when TLSDir is "" (a
	// test, or a node network the operator vouches for).
	Insecure bool
}

// peerTLS loads the mutual TLS configuration of dir: the server asks every
// client for a certificate of the CA, and the client checks the server's
// chain against the CA. Mounters share one identity (the CA's mounter
// certificate), so the name in the certificate is not checked: peers are
// addressed by IP.
func peerTLS(dir string) (server, client *tls.Config, err error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("%s: no certificate", filepath.Join(dir, "ca.crt"))
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	client = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		InsecureSkipVerify: true, // the chain is checked below, without a host name
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("peer sent no certificate")
			}
			leaf, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			inter := x509.NewCertPool()
			for _, r := range raw[1:] {
				if c, err := x509.ParseCertificate(r); err == nil {
					inter.AddCert(c)
				}
			}
			_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
			return err
		}}
	return server, client, nil
}

// startPeers starts the peer server of c over cache and returns the hook
// that puts the peers in front of a mount's registry source.
func startPeers(ctx context.Context, c PeerConfig, cache *chunkcache.Cache, met *metrics.Metrics, log *slog.Logger) (func(oci.Ref, content.Fetcher) content.Fetcher, error) {
	if c.TLSDir == "" && !c.Insecure {
		return nil, errors.New("the peer tier needs a TLS directory (ca.crt, tls.crt, tls.key) or an explicit choice of plain HTTP")
	}
	self := c.Advertise
	if self == "" {
		self = c.Listen
	}
	ring := peer.NewRing(self)
	ring.Set(c.Peers)
	srv := &peer.Server{Cache: cache, Ring: ring}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}}
	scheme := "http"
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	if c.TLSDir != "" {
		sc, cc, err := peerTLS(c.TLSDir)
		if err != nil {
			return nil, fmt.Errorf("peer TLS: %w", err)
		}
		hs.TLSConfig = sc
		client.Transport.(*http.Transport).TLSClientConfig = cc
		scheme = "https"
	}
	l, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, fmt.Errorf("peer server: %w", err)
	}
	if hs.TLSConfig != nil {
		l = tls.NewListener(l, hs.TLSConfig)
	}
	go hs.Serve(l)
	go func() {
		<-ctx.Done()
		hs.Close()
	}()
	stats := new(peer.Stats)
	met.Peers(func() metrics.PeerSample {
		s := srv.Stats()
		return metrics.PeerSample{FromPeers: stats.PeerBytes.Load(), FromSource: stats.SourceBytes.Load(),
			ServedToPeers: s.ServedBytes, PeerFailures: stats.PeerFailures.Load(), Refused: s.Refused}
	})
	log.Info("peer tier on", "listen", c.Listen, "self", self, "peers", len(ring.Members()), "tls", c.TLSDir != "")
	return func(ref oci.Ref, src content.Fetcher) content.Fetcher {
		f := peer.NewFetcher(ring, ref.Registry, ref.Repository, src, peer.Options{Client: client, Scheme: scheme, Stats: stats})
		// This node fetches for its peers the chunks it owns of the
		// versions the mount opened, until the mount ends (f.Close).
		f.OnClose(srv.Serve(ref.Repo(), src, f.Known))
		return f
	}, nil
}
