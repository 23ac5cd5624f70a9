package peer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
)

// TLS is the mutual TLS of a node's peer traffic: the cluster CA's pool
// and this node's certificate of it, set once known (SetCA, LoadDir); until
// then every handshake fails.
type TLS struct {
	pool atomic.Pointer[x509.CertPool]
	cert atomic.Pointer[func() (*tls.Certificate, error)]
}

// SetCA sets the CA pool peers are checked against and the function that
// gives this node's certificate.
func (s *TLS) SetCA(pool *x509.CertPool, cert func() (*tls.Certificate, error)) {
	s.cert.Store(&cert)
	s.pool.Store(pool)
}

// certificate returns this node's certificate.
func (s *TLS) certificate() (*tls.Certificate, error) {
	f := s.cert.Load()
	if f == nil {
		return nil, errors.New("the peer certificate is not known yet")
	}
	return (*f)()
}

// verify checks a peer's chain against the cluster CA, without a host name:
// mounters are addressed by IP and share one CA.
func (s *TLS) verify(raw [][]byte, usage x509.ExtKeyUsage) error {
	pool := s.pool.Load()
	if pool == nil {
		return errors.New("the peer CA is not known yet")
	}
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
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// Configs returns the server's and the client's mutual TLS configuration:
// each side presents this node's certificate and checks the other's
// against the cluster CA, without a host name (peers are addressed by IP
// and share one CA).
func (s *TLS) Configs() (server, client *tls.Config) {
	server = &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.certificate() },
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return s.verify(raw, x509.ExtKeyUsageClientAuth)
		}}
	client = &tls.Config{MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return s.certificate() },
		InsecureSkipVerify:   true, // the chain is checked by VerifyPeerCertificate, without a host name
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return s.verify(raw, x509.ExtKeyUsageServerAuth)
		}}
	return server, client
}

// LoadDir sets s from dir's ca.crt, tls.crt and tls.key (a certificate
// of the CA every node presents).
func (s *TLS) LoadDir(dir string) error {
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s: no certificate", filepath.Join(dir, "ca.crt"))
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return err
	}
	s.SetCA(pool, func() (*tls.Certificate, error) { return &cert, nil })
	return nil
}
