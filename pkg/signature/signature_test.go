package signature

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

func newKey(t *testing.T, dir, name string) (Signer, string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := EncodePublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pp := filepath.Join(dir, name+".pub")
	if err := os.WriteFile(pp, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := NewSigner(k)
	if err != nil {
		t.Fatal(err)
	}
	return s, pp
}

// keyFile writes s's key in cosign's encrypted format (scrypt: slow, once).
func keyFile(t *testing.T, dir string, s Signer) string {
	t.Helper()
	enc, err := EncryptPrivateKey(s.(*keySigner).priv, []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	kp := filepath.Join(dir, "cosign.key")
	if err := os.WriteFile(kp, enc, 0o600); err != nil {
		t.Fatal(err)
	}
	return kp
}

func openLayout(t *testing.T) (oci.Target, ocispec.Descriptor, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	ref, err := oci.ParseRef("oci:" + filepath.Join(t.TempDir(), "repo") + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	var descs []ocispec.Descriptor
	for _, s := range []string{"a", "b"} {
		b, _ := json.Marshal(ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: ocispec.DescriptorEmptyJSON,
			Annotations: map[string]string{"x": s}})
		b = append([]byte(`{"schemaVersion":2,`), b[1:]...)
		d := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, b)
		if err := pushIfMissing(ctx, tg, ocispec.DescriptorEmptyJSON, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		if err := pushIfMissing(ctx, tg, d, b); err != nil {
			t.Fatal(err)
		}
		descs = append(descs, d)
	}
	return tg, descs[0], descs[1]
}

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	s0, pp := newKey(t, dir, "a")
	kp := keyFile(t, dir, s0)
	s, err := LoadPrivateKey(kp, func() ([]byte, error) { return []byte("pw"), nil })
	if err != nil {
		t.Fatal(err)
	}
	v, err := LoadPublicKey(pp, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.KeyID() != s.Verifier().KeyID() || len(v.KeyID()) != 64 {
		t.Fatalf("key ids %s and %s", v.KeyID(), s.Verifier().KeyID())
	}
	if _, err := LoadPrivateKey(kp, func() ([]byte, error) { return []byte("wrong"), nil }); !errors.Is(err, ErrKey) {
		t.Fatalf("wrong password: %v", err)
	}
	if _, err := LoadPublicKey(kp, nil); !errors.Is(err, ErrKey) {
		t.Fatalf("private key as public without password: %v", err)
	}
	p := []byte("payload")
	sig, err := s.Sign(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(context.Background(), p, sig); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(context.Background(), []byte("payloaD"), sig); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("changed payload: %v", err)
	}
	_, ek, _ := ed25519.GenerateKey(rand.Reader)
	es, err := NewSigner(ek)
	if err != nil {
		t.Fatal(err)
	}
	esig, _ := es.Sign(context.Background(), p)
	if err := es.Verifier().Verify(context.Background(), p, esig); err != nil {
		t.Fatal(err)
	}
}

func TestSignVerify(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, _ := newKey(t, dir, "a")
	b, _ := newKey(t, dir, "b")
	tg, v1, v2 := openLayout(t)
	va := []Verifier{a.Verifier()}

	if _, err := Verify(ctx, tg, v1, va); !errors.Is(err, ErrUnsigned) {
		t.Fatalf("unsigned: %v", err)
	}
	if _, err := Sign(ctx, tg, "repo", v1, a); err != nil {
		t.Fatal(err)
	}
	got, err := Verify(ctx, tg, v1, va)
	if err != nil {
		t.Fatal(err)
	}
	if got.KeyID != a.Verifier().KeyID() {
		t.Fatalf("key id %s", got.KeyID)
	}
	if _, err := Verify(ctx, tg, v1, []Verifier{b.Verifier()}); !errors.Is(err, ErrOtherKey) {
		t.Fatalf("other key: %v", err)
	}
	// Both keys accepted: a second signature is appended.
	if _, err := Sign(ctx, tg, "repo", v1, b); err != nil {
		t.Fatal(err)
	}
	es, _ := Find(ctx, tg, v1)
	if len(es) != 2 {
		t.Fatalf("%d signatures, want 2", len(es))
	}
	if _, err := Verify(ctx, tg, v1, []Verifier{b.Verifier()}); err != nil {
		t.Fatal(err)
	}

	// The signature manifest of v1 copied under v2's tag: another digest.
	md, _ := tg.Resolve(ctx, Tag(v1.Digest))
	if err := tg.Tag(ctx, md, Tag(v2.Digest)); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(ctx, tg, v2, va); !errors.Is(err, ErrOtherDigest) {
		t.Fatalf("copied signature: %v", err)
	}

	// A tampered signature: same key id claimed, bytes changed.
	m, _ := fetchManifest(ctx, tg, md)
	l := m.Layers[0]
	sig, _ := base64.StdEncoding.DecodeString(l.Annotations[AnnotationSignature])
	sig[len(sig)-1] ^= 1
	l.Annotations[AnnotationSignature] = base64.StdEncoding.EncodeToString(sig)
	m.Layers = []ocispec.Descriptor{l}
	mb, _ := json.Marshal(m)
	nd := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, mb)
	if err := pushIfMissing(ctx, tg, nd, mb); err != nil {
		t.Fatal(err)
	}
	if err := tg.Tag(ctx, nd, Tag(v1.Digest)); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(ctx, tg, v1, va); !errors.Is(err, ErrTampered) {
		t.Fatalf("tampered: %v", err)
	}

	n, err := Delete(ctx, tg, v1)
	if err != nil || n != 1 {
		t.Fatalf("delete: %d, %v", n, err)
	}
	if _, err := Verify(ctx, tg, v1, va); !errors.Is(err, ErrUnsigned) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestTag(t *testing.T) {
	d := digest.FromString("x")
	if !IsTag(Tag(d)) || IsTag("v1") || IsTag("sha256-zz.sig") {
		t.Fatal("IsTag")
	}
}

func TestPolicyFromValue(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, pub := newKey(t, dir, "a")
	pem, _ := os.ReadFile(pub)
	tg, v1, _ := openLayout(t)
	if _, err := Sign(ctx, tg, "repo", v1, a); err != nil {
		t.Fatal(err)
	}
	for _, val := range []string{pub, "a.pub", string(pem)} {
		p, err := PolicyFromValue(val, dir)
		if err != nil || !p.Required() {
			t.Fatalf("%q: %v", val, err)
		}
		if err := p.Check(ctx, tg, v1); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := PolicyFromValue(string(pem), ""); err != nil || !p.Required() {
		t.Fatalf("inline key without a key directory: %v", err)
	}
	if _, err := PolicyFromValue(pub, ""); !errors.Is(err, ErrKeyName) {
		t.Fatalf("a key file without a key directory: %v", err)
	}
	if p, err := PolicyFromValue("", ""); err != nil || p.Required() {
		t.Fatalf("empty: %v", err)
	}
	if _, err := PolicyFromValue("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----", ""); !errors.Is(err, ErrKey) {
		t.Fatalf("bad inline key: %v", err)
	}
	b, _ := newKey(t, dir, "b")
	err := Policy{Keys: []Verifier{b.Verifier()}}.Check(ctx, tg, v1)
	if !errors.Is(err, ErrRefused) || !errors.Is(err, ErrOtherKey) {
		t.Fatalf("other key: %v", err)
	}
}

// openRegistry starts go-containerregistry's registry, with or without the
// referrers API, and pushes a version-like manifest to it.
func openRegistry(t *testing.T, referrers bool) (oci.Target, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	srv := httptest.NewServer(ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithReferrersSupport(referrers)))
	t.Cleanup(srv.Close)
	ref, err := oci.ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/sig:v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}`)
	d := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, b)
	if err := pushIfMissing(ctx, tg, ocispec.DescriptorEmptyJSON, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := pushIfMissing(ctx, tg, d, b); err != nil {
		t.Fatal(err)
	}
	return tg, d
}

// On a registry serving the referrers API, Sign stores the signature both
// under the tag and as a cosign-style OCI 1.1 referrer, each verifying on
// its own, and Delete removes both; without the API it writes the tag only.
func TestSignReferrer(t *testing.T) {
	ctx := context.Background()
	a, _ := newKey(t, t.TempDir(), "a")
	va := []Verifier{a.Verifier()}

	tg, v := openRegistry(t, true)
	e, err := Sign(ctx, tg, "vol/sig", v, a)
	if err != nil {
		t.Fatal(err)
	}
	if e.ReferrerManifest.Digest == "" {
		t.Fatal("no referrer written on a registry serving the referrers API")
	}
	refs, err := oci.Referrers(ctx, tg, v, ArtifactTypeSignature)
	if err != nil || len(refs) != 1 || refs[0].Digest != e.ReferrerManifest.Digest {
		t.Fatalf("signature referrers %v (%v), want %s", refs, err, e.ReferrerManifest.Digest)
	}
	m, err := fetchManifest(ctx, tg, e.ReferrerManifest)
	if err != nil {
		t.Fatal(err)
	}
	if m.ArtifactType != ArtifactTypeSignature || m.Config.MediaType != ArtifactTypeSignature ||
		m.Subject == nil || m.Subject.Digest != v.Digest || len(m.Layers) != 1 ||
		m.Layers[0].MediaType != MediaTypeSimpleSigning || m.Layers[0].Annotations[AnnotationSignature] == "" {
		t.Fatalf("referrer manifest is not cosign's OCI 1.1 form: %+v", m)
	}
	es, err := Find(ctx, tg, v)
	if err != nil || len(es) != 2 || es[0].Referrer || !es[1].Referrer {
		t.Fatalf("found %+v (%v): want the tag's and the referrer's", es, err)
	}
	// The referrer's signature verifies on its own.
	if err := a.Verifier().Verify(ctx, es[1].Payload, es[1].Sig); err != nil {
		t.Fatalf("referrer signature: %v", err)
	}
	if d, err := signedDigest(es[1].Payload); err != nil || d != v.Digest {
		t.Fatalf("referrer payload names %s (%v), want %s", d, err, v.Digest)
	}
	if _, err := Sign(ctx, tg, "vol/sig", v, a); err != nil {
		t.Fatal(err)
	}
	if n, err := Delete(ctx, tg, v); err != nil || n != 3 {
		t.Fatalf("delete: %d manifests (%v), want the tag's and 2 referrers", n, err)
	}
	if refs, err := oci.Referrers(ctx, tg, v, ""); err != nil || len(refs) != 0 {
		t.Fatalf("referrers after delete: %v (%v)", refs, err)
	}
	if ok, err := tg.Exists(ctx, e.ReferrerManifest); ok || err != nil {
		t.Fatalf("referrer %s after delete: exists %v (%v)", e.ReferrerManifest.Digest, ok, err)
	}

	tg, v = openRegistry(t, false)
	if e, err = Sign(ctx, tg, "vol/sig", v, a); err != nil || e.ReferrerManifest.Digest != "" {
		t.Fatalf("without the referrers API: referrer %q (%v)", e.ReferrerManifest.Digest, err)
	}
	if _, err := tg.Resolve(ctx, v.Digest.Algorithm().String()+"-"+v.Digest.Encoded()); !errors.Is(err, oci.ErrNotFound) {
		t.Fatalf("referrers tag-schema index written without a referrer: %v", err)
	}
	if got, err := Verify(ctx, tg, v, va); err != nil || got.Entry.Referrer {
		t.Fatalf("verify by tag: %+v, %v", got, err)
	}
}

// TestVerifyListsFewClaims: a refusal names at most 8 of the
// key ids the signatures claim, however many signatures the registry has.
func TestVerifyListsFewClaims(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	tg, v1, _ := openLayout(t)
	for i := range 12 {
		k, _ := newKey(t, dir, fmt.Sprintf("k%d", i))
		if _, err := Sign(ctx, tg, "repo", v1, k); err != nil {
			t.Fatal(err)
		}
	}
	other, _ := newKey(t, dir, "other")
	_, err := Verify(ctx, tg, v1, []Verifier{other.Verifier()})
	if !errors.Is(err, ErrOtherKey) {
		t.Fatalf("other key: %v", err)
	}
	msg := err.Error()
	_, claimed, _ := strings.Cut(msg, "signatures claim key ")
	if n := strings.Count(claimed, ", ") + 1; n > 8+1 || !strings.Contains(claimed, "and 4 more") {
		t.Errorf("refusal lists %d claimed ids: %s", n, msg)
	}
}
