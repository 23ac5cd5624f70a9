package signature

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"github.com/secure-systems-lab/go-securesystemslib/encrypted"

	"github.com/bdnvol/bdnvol/internal/bounded"
)

// Errors wrapped by key loading and by verification.
var (
	// ErrKey is wrapped when a key file cannot be read or used.
	ErrKey = errors.New("unusable key")
	// ErrBadSignature is wrapped when a signature does not verify with a key.
	ErrBadSignature = errors.New("signature does not verify")
)

// PEM block types of cosign's encrypted private keys and of public keys.
const (
	pemSigstorePrivate = "ENCRYPTED SIGSTORE PRIVATE KEY"
	pemCosignPrivate   = "ENCRYPTED COSIGN PRIVATE KEY"
	pemPublic          = "PUBLIC KEY"
	maxKeyFile         = 64 << 10
)

// Signer signs payloads; a key file, a KMS key or a keyless identity.
type Signer interface {
	// Sign returns the signature of payload.
	Sign(ctx context.Context, payload []byte) ([]byte, error)
	// Verifier returns the verifier of this signer's signatures.
	Verifier() Verifier
}

// Verifier checks signatures of payloads.
type Verifier interface {
	// Verify returns nil when sig is a signature of payload by this key.
	Verify(ctx context.Context, payload, sig []byte) error
	// KeyID names the key: sha256 of its public key's DER, in hex.
	KeyID() string
}

// keyVerifier verifies with a public key held in memory.
type keyVerifier struct {
	pub crypto.PublicKey
	id  string
}

// NewVerifier returns a Verifier for an ECDSA P-256/P-384/P-521, Ed25519 or
// RSA public key.
func NewVerifier(pub crypto.PublicKey) (Verifier, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey, ed25519.PublicKey, *rsa.PublicKey:
	default:
		return nil, fmt.Errorf("public key of type %T: %w", k, ErrKey)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("public key: %w: %v", ErrKey, err)
	}
	return &keyVerifier{pub: pub, id: Fingerprint(der)}, nil
}

// PublicKeyPEM returns the PEM public key of v, as ParsePublicKey reads it;
// an error for a verifier that holds no key in memory.
func PublicKeyPEM(v Verifier) ([]byte, error) {
	k, ok := v.(*keyVerifier)
	if !ok {
		return nil, fmt.Errorf("verifier %s: %w: no public key to encode", short(v.KeyID()), ErrKey)
	}
	return EncodePublicKey(k.pub)
}

// Fingerprint is the key id of a public key given as PKIX DER: sha256, hex.
func Fingerprint(der []byte) string {
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:])
}

func hashFor(pub crypto.PublicKey) crypto.Hash {
	if k, ok := pub.(*ecdsa.PublicKey); ok {
		switch k.Curve {
		case elliptic.P384():
			return crypto.SHA384
		case elliptic.P521():
			return crypto.SHA512
		}
	}
	return crypto.SHA256
}

func digestOf(h crypto.Hash, payload []byte) []byte {
	w := h.New()
	w.Write(payload)
	return w.Sum(nil)
}

// Verify checks sig over payload.
func (v *keyVerifier) Verify(_ context.Context, payload, sig []byte) error {
	ok := false
	switch k := v.pub.(type) {
	case *ecdsa.PublicKey:
		ok = ecdsa.VerifyASN1(k, digestOf(hashFor(k), payload), sig)
	case ed25519.PublicKey:
		ok = ed25519.Verify(k, payload, sig)
	case *rsa.PublicKey:
		ok = rsa.VerifyPKCS1v15(k, crypto.SHA256, digestOf(crypto.SHA256, payload), sig) == nil
	}
	if !ok {
		return fmt.Errorf("key %s: %w", short(v.id), ErrBadSignature)
	}
	return nil
}

// KeyID is the key's fingerprint.
func (v *keyVerifier) KeyID() string { return v.id }

// keySigner signs with a private key held in memory.
type keySigner struct {
	priv crypto.Signer
	v    Verifier
}

// NewSigner returns a Signer for an ECDSA, Ed25519 or RSA private key.
func NewSigner(priv crypto.Signer) (Signer, error) {
	v, err := NewVerifier(priv.Public())
	if err != nil {
		return nil, err
	}
	return &keySigner{priv: priv, v: v}, nil
}

// Sign signs payload as cosign does for the key's type.
func (s *keySigner) Sign(_ context.Context, payload []byte) ([]byte, error) {
	switch k := s.priv.(type) {
	case ed25519.PrivateKey:
		return ed25519.Sign(k, payload), nil
	case *ecdsa.PrivateKey:
		return ecdsa.SignASN1(rand.Reader, k, digestOf(hashFor(&k.PublicKey), payload))
	default:
		return s.priv.Sign(rand.Reader, digestOf(crypto.SHA256, payload), crypto.SHA256)
	}
}

// Verifier returns the verifier of the signer's public key.
func (s *keySigner) Verifier() Verifier { return s.v }

// ParsePublicKey reads a PEM "PUBLIC KEY" block (PKIX).
func ParsePublicKey(b []byte) (Verifier, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != pemPublic {
		return nil, fmt.Errorf("no PEM %q block: %w", pemPublic, ErrKey)
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("public key: %w: %v", ErrKey, err)
	}
	return NewVerifier(pub)
}

// LoadPublicKey reads a PEM public key file. A cosign private key file is
// accepted too when password is not nil (its public half is used).
func LoadPublicKey(path string, password func() ([]byte, error)) (Verifier, error) {
	b, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	if block, _ := pem.Decode(b); block != nil && isPrivateType(block.Type) && password != nil {
		s, err := parsePrivate(path, block, password)
		if err != nil {
			return nil, err
		}
		return s.Verifier(), nil
	}
	v, err := ParsePublicKey(b)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", path, err)
	}
	return v, nil
}

// LoadPrivateKey reads cosign's encrypted private key format (scrypt and
// nacl secretbox); password is asked only when needed.
func LoadPrivateKey(path string, password func() ([]byte, error)) (Signer, error) {
	b, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil || !isPrivateType(block.Type) {
		return nil, fmt.Errorf("key %s: no PEM %q block: %w", path, pemSigstorePrivate, ErrKey)
	}
	return parsePrivate(path, block, password)
}

func isPrivateType(t string) bool { return t == pemSigstorePrivate || t == pemCosignPrivate }

func parsePrivate(path string, block *pem.Block, password func() ([]byte, error)) (Signer, error) {
	pass, err := password()
	if err != nil {
		return nil, fmt.Errorf("key %s: password: %w", path, err)
	}
	der, err := encrypted.Decrypt(block.Bytes, pass)
	if err != nil {
		return nil, fmt.Errorf("key %s: decrypt (wrong password?): %w: %v", path, ErrKey, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w: %v", path, ErrKey, err)
	}
	cs, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key %s: private key of type %T: %w", path, k, ErrKey)
	}
	s, err := NewSigner(cs)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", path, err)
	}
	return s, nil
}

// EncryptPrivateKey writes priv in cosign's encrypted private key format.
func EncryptPrivateKey(priv crypto.Signer, password []byte) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("private key: %w: %v", ErrKey, err)
	}
	ct, err := encrypted.Encrypt(der, password)
	if err != nil {
		return nil, fmt.Errorf("encrypt private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemSigstorePrivate, Bytes: ct}), nil
}

// EncodePublicKey returns pub as a PEM "PUBLIC KEY" block.
func EncodePublicKey(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("public key: %w: %v", ErrKey, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublic, Bytes: der}), nil
}

// readKeyFile reads a key file the user names. It is opened without
// blocking (a FIFO's open waits for a writer) and refused unless it is a
// regular file of at most maxKeyFile bytes.
func readKeyFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|openFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", path, err)
	}
	defer f.Close()
	b, err := readRegular(f)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", path, err)
	}
	return b, nil
}

// readRegular reads f, a regular file of at most maxKeyFile bytes.
func readRegular(f *os.File) ([]byte, error) {
	b, err := bounded.ReadRegular(f, maxKeyFile)
	if errors.Is(err, bounded.ErrNotRegular) || errors.Is(err, bounded.ErrTooLarge) {
		return nil, fmt.Errorf("%v: %w", err, ErrKey)
	}
	return b, err
}

func short(id string) string {
	if len(id) > 16 {
		return id[:16]
	}
	return id
}
