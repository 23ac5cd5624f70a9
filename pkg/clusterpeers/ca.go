package clusterpeers

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// The keys of the CA Secret.
const (
	CACertKey = "ca.crt"
	CAKeyKey  = "ca.key"
)

// caLifetime and leafLifetime are how long a new CA and a mounter's
// certificate are valid; a certificate is issued again when a tenth of its
// life is left.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 30 * 24 * time.Hour
)

// CA is the cluster CA of peer mutual TLS: every mounter holds it and
// issues its own certificate with it.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

// NewCA makes a new CA (ECDSA P-256, self-signed).
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "bdnvol peers CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(caLifetime), IsCA: true, BasicConstraintsValid: true,
		MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return newCA(cert, key), nil
}

func newCA(cert *x509.Certificate, key *ecdsa.PrivateKey) *CA {
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, pool: pool}
}

// serial is a random certificate serial number.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// PEM returns the CA's certificate and key, PEM-encoded.
func (c *CA) PEM() (cert, key []byte, err error) {
	kb, err := x509.MarshalECPrivateKey(c.key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// ParseCA reads a CA from its PEM certificate and key, checking that they
// belong together and that the certificate is a CA's.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, errors.New("the certificate is not a CA's")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "EC PRIVATE KEY" {
		return nil, errors.New("no PEM EC private key")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("the key is not the certificate's")
	}
	return newCA(cert, key), nil
}

// Pool returns a pool holding the CA's certificate.
func (c *CA) Pool() *x509.CertPool { return c.pool }

// Issue returns a new certificate of the CA for a mounter, for server and
// client use, naming addr's IP (addr is host:port or an IP).
func (c *CA) Issue(addr string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "bdnvol mounter"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(leafLifetime), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	if tmpl.NotAfter.After(c.cert.NotAfter) {
		tmpl.NotAfter = c.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// Identity is a mounter's certificate of a CA, issued again before it
// expires.
type Identity struct {
	CA   *CA
	Addr string

	mu   sync.Mutex
	cert *tls.Certificate
}

// Certificate returns the mounter's current certificate, issuing a new one
// when a tenth of the old one's life is left.
func (id *Identity) Certificate() (*tls.Certificate, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	if c := id.cert; c != nil && time.Until(c.Leaf.NotAfter) > c.Leaf.NotAfter.Sub(c.Leaf.NotBefore)/10 {
		return c, nil
	}
	c, err := id.CA.Issue(id.Addr)
	if err != nil {
		return nil, err
	}
	id.cert = c
	return c, nil
}

// LoadOrCreateCA returns the CA that the Secret namespace/name holds. When
// the Secret holds none (as the chart creates it: empty), it makes one and
// writes it into the Secret, unless another mounter did so first, in which
// case it returns that one: every mounter ends with the same CA. The Secret
// must exist: a mounter needs only get and update on it, never create.
func LoadOrCreateCA(ctx context.Context, cfg *rest.Config, namespace, name string) (*CA, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("Secrets client: %w", err)
	}
	secrets := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).Namespace(namespace)
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s, err := secrets.Get(rctx, name, metav1.GetOptions{})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("peer CA Secret %s/%s: %w", namespace, name, err)
		}
		if kind := s.GetKind(); kind != "Secret" {
			return nil, fmt.Errorf("peer CA Secret %s/%s: the API server answered a %q", namespace, name, kind)
		}
		data, _, _ := unstructured.NestedStringMap(s.Object, "data")
		certPEM, cerr := base64.StdEncoding.DecodeString(data[CACertKey])
		keyPEM, kerr := base64.StdEncoding.DecodeString(data[CAKeyKey])
		if len(certPEM) > 0 || len(keyPEM) > 0 || cerr != nil || kerr != nil {
			if err := errors.Join(cerr, kerr); err != nil {
				return nil, fmt.Errorf("peer CA Secret %s/%s: %w", namespace, name, err)
			}
			ca, err := ParseCA(certPEM, keyPEM)
			if err != nil {
				return nil, fmt.Errorf("peer CA Secret %s/%s: %w (delete its data to have a new CA made)", namespace, name, err)
			}
			return ca, nil
		}
		ca, err := NewCA()
		if err != nil {
			return nil, err
		}
		certPEM, keyPEM, err = ca.PEM()
		if err != nil {
			return nil, err
		}
		s = s.DeepCopy()
		if data == nil {
			data = map[string]string{}
		}
		data[CACertKey] = base64.StdEncoding.EncodeToString(certPEM)
		data[CAKeyKey] = base64.StdEncoding.EncodeToString(keyPEM)
		if err := unstructured.SetNestedStringMap(s.Object, data, "data"); err != nil {
			return nil, err
		}
		rctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		_, err = secrets.Update(rctx, s, metav1.UpdateOptions{}) // resourceVersion: fails if another mounter wrote first
		cancel()
		switch {
		case err == nil:
			return ca, nil
		case apierrors.IsConflict(err) && attempt < 5:
			continue // another mounter filled it: read that one
		default:
			return nil, fmt.Errorf("peer CA Secret %s/%s: writing a new CA: %w", namespace, name, err)
		}
	}
}
