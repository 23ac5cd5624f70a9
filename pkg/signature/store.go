package signature

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Media types and annotations of cosign signatures.
const (
	// MediaTypeSimpleSigning is the media type of a signed payload layer.
	MediaTypeSimpleSigning = "application/vnd.dev.cosign.simplesigning.v1+json"
	// ArtifactTypeSignature is the artifact type of a signature stored as an
	// OCI 1.1 referrer.
	ArtifactTypeSignature = "application/vnd.dev.cosign.artifact.sig.v1+json"
	// AnnotationSignature holds the base64 signature of a payload layer.
	AnnotationSignature = "dev.cosignproject.cosign/signature"
	// AnnotationKeyID is the key id bdnvol records beside its signatures; a
	// claim, not a proof.
	AnnotationKeyID = "dev.bdnvol.signature/key"
	// TagSuffix ends cosign's signature tags: <alg>-<hex>.sig.
	TagSuffix = ".sig"

	maxPayload  = 64 << 10 // bytes of one signed payload
	maxManifest = 1 << 20  // bytes of one signature manifest
	maxLayers   = 256      // layers of the signature tag's manifest Sign appends to

	// Bounds of what one verification reads, whatever the registry lists:
	// signature manifests (the tag's and referrers), simple-signing entries
	// of each, and payload bytes in all (each payload blob is fetched once).
	maxSigManifests = 64
	maxSigEntries   = 32
	maxPayloads     = 4 << 20
)

// Errors wrapped by Verify; each names why a version is refused.
var (
	// ErrUnsigned: no signature of the version was found.
	ErrUnsigned = errors.New("no signature")
	// ErrOtherKey: the signatures found verify with none of the keys.
	ErrOtherKey = errors.New("signed by another key")
	// ErrOtherDigest: a signature by the key names another digest.
	ErrOtherDigest = errors.New("signature of another digest")
	// ErrTampered: a signature claims the key but does not verify with it.
	ErrTampered = errors.New("signature or payload tampered with")
)

// Tag returns cosign's signature tag for d: sha256-<hex>.sig.
func Tag(d digest.Digest) string {
	return d.Algorithm().String() + "-" + d.Encoded() + TagSuffix
}

// IsTag reports whether tag is a cosign signature tag.
func IsTag(tag string) bool {
	alg, rest, ok := strings.Cut(strings.TrimSuffix(tag, TagSuffix), "-")
	return ok && strings.HasSuffix(tag, TagSuffix) && digest.Algorithm(alg).Available() &&
		digest.Algorithm(alg).Validate(rest) == nil
}

// Entry is one signature of a version found in the repository.
type Entry struct {
	Payload  []byte
	Sig      []byte
	KeyID    string             // the key id the signature claims; "" if none
	Manifest ocispec.Descriptor // the manifest that holds it
	Referrer bool               // found as an OCI 1.1 referrer, not by tag
	// ReferrerManifest is, from Sign only, the OCI 1.1 referrer it also
	// wrote; zero when the target does not serve the referrers API.
	ReferrerManifest ocispec.Descriptor
}

// Sign signs version desc of repo (its name, as a reference without tag) with
// s and stores the signature under the tag scheme, beside any already there,
// which is where cosign (v2) looks by default. Where t serves the OCI 1.1
// referrers API it also stores it as a referrer of desc, in the form cosign's
// --registry-referrers-mode=oci-1-1 writes (see pushReferrer).
func Sign(ctx context.Context, t oras.Target, repo string, desc ocispec.Descriptor, s Signer) (Entry, error) {
	p, err := Payload(repo, desc.Digest)
	if err != nil {
		return Entry{}, err
	}
	sig, err := s.Sign(ctx, p)
	if err != nil {
		return Entry{}, fmt.Errorf("sign %s: %w", desc.Digest, err)
	}
	layer := content.NewDescriptorFromBytes(MediaTypeSimpleSigning, p)
	layer.Annotations = map[string]string{
		AnnotationSignature: base64.StdEncoding.EncodeToString(sig),
		AnnotationKeyID:     s.Verifier().KeyID(),
	}
	var referrer ocispec.Descriptor
	api, err := oci.ServesReferrers(ctx, t, desc)
	if err != nil {
		return Entry{}, fmt.Errorf("sign %s: %w", desc.Digest, err)
	}
	if api {
		if referrer, err = pushReferrer(ctx, t, desc, layer, p); err != nil {
			return Entry{}, err
		}
	}
	tag := Tag(desc.Digest)
	var layers []ocispec.Descriptor
	if old, err := t.Resolve(ctx, tag); err == nil {
		m, err := fetchManifest(ctx, t, old)
		if err != nil {
			return Entry{}, fmt.Errorf("signatures of %s (%s): %w", desc.Digest, tag, err)
		}
		for _, l := range m.Layers {
			if l.Digest == layer.Digest && l.Annotations[AnnotationSignature] == layer.Annotations[AnnotationSignature] {
				continue
			}
			layers = append(layers, l)
		}
	} else if !errors.Is(err, errdef.ErrNotFound) {
		return Entry{}, fmt.Errorf("signatures of %s (%s): %w", desc.Digest, tag, err)
	}
	layers = append(layers, layer)
	if err := pushIfMissing(ctx, t, layer, p); err != nil {
		return Entry{}, err
	}
	cfg, err := imageConfig(layers)
	if err != nil {
		return Entry{}, err
	}
	cfgDesc := content.NewDescriptorFromBytes(ocispec.MediaTypeImageConfig, cfg)
	if err := pushIfMissing(ctx, t, cfgDesc, cfg); err != nil {
		return Entry{}, err
	}
	mb, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    cfgDesc,
		Layers:    layers,
	})
	if err != nil {
		return Entry{}, err
	}
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, mb)
	if err := pushIfMissing(ctx, t, md, mb); err != nil {
		return Entry{}, err
	}
	if err := t.Tag(ctx, md, tag); err != nil {
		return Entry{}, fmt.Errorf("tag signature of %s as %s: %w", desc.Digest, tag, err)
	}
	return Entry{Payload: p, Sig: sig, KeyID: s.Verifier().KeyID(), Manifest: md, ReferrerManifest: referrer}, nil
}

// pushReferrer stores the signature layer (payload p, its signature in the
// layer's annotations) as an OCI 1.1 referrer of desc, as cosign's
// --registry-referrers-mode=oci-1-1 does: an image manifest with subject
// desc, artifactType ArtifactTypeSignature, and a config of that media type
// (the registry lists its artifact type from either). It returns the
// manifest's descriptor. A registry without the referrers API needs the
// caller to keep the referrers tag-schema index (oras-go's repository does).
func pushReferrer(ctx context.Context, t oras.Target, desc ocispec.Descriptor, layer ocispec.Descriptor, p []byte) (ocispec.Descriptor, error) {
	if err := pushIfMissing(ctx, t, layer, p); err != nil {
		return ocispec.Descriptor{}, err
	}
	cfg, err := imageConfig([]ocispec.Descriptor{layer})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	cfgDesc := content.NewDescriptorFromBytes(ArtifactTypeSignature, cfg)
	if err := pushIfMissing(ctx, t, cfgDesc, cfg); err != nil {
		return ocispec.Descriptor{}, err
	}
	mb, err := json.Marshal(ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactTypeSignature,
		Config:       cfgDesc,
		Layers:       []ocispec.Descriptor{layer},
		Subject:      &ocispec.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size},
	})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, mb)
	if err := pushIfMissing(ctx, t, md, mb); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("signature referrer of %s: %w", desc.Digest, err)
	}
	return md, nil
}

// imageConfig is the image config cosign's signature images carry: one
// diff id per payload layer (payloads are not compressed).
func imageConfig(layers []ocispec.Descriptor) ([]byte, error) {
	diffs := make([]string, len(layers))
	history := make([]map[string]string, len(layers))
	for i, l := range layers {
		diffs[i] = l.Digest.String()
		history[i] = map[string]string{"created": "0001-01-01T00:00:00Z"}
	}
	return json.Marshal(map[string]any{
		"architecture": "",
		"created":      "0001-01-01T00:00:00Z",
		"history":      history,
		"os":           "",
		"rootfs":       map[string]any{"type": "layers", "diff_ids": diffs},
		"config":       map[string]any{},
	})
}

func pushIfMissing(ctx context.Context, t oras.Target, d ocispec.Descriptor, b []byte) error {
	ok, err := t.Exists(ctx, d)
	if err == nil && ok {
		return nil
	}
	if err := t.Push(ctx, d, bytes.NewReader(b)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
		return fmt.Errorf("push %s %s: %w", d.MediaType, d.Digest, err)
	}
	return nil
}

func fetchManifest(ctx context.Context, t content.Fetcher, d ocispec.Descriptor) (*ocispec.Manifest, error) {
	m, err := readManifest(ctx, t, d)
	if err != nil {
		return nil, err
	}
	if len(m.Layers) > maxLayers {
		return nil, fmt.Errorf("manifest %s: %d layers, more than %d", d.Digest, len(m.Layers), maxLayers)
	}
	return m, nil
}

// readManifest fetches and parses the manifest d, of at most maxManifest bytes.
func readManifest(ctx context.Context, t content.Fetcher, d ocispec.Descriptor) (*ocispec.Manifest, error) {
	if d.Size <= 0 || d.Size > maxManifest {
		return nil, fmt.Errorf("manifest %s of %d bytes", d.Digest, d.Size)
	}
	b, err := verify.Fetch(ctx, t, "", d)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	return &m, nil
}

// Manifests returns the descriptors of the manifests that hold signatures of
// desc: the tag-scheme one and OCI 1.1 referrers of the signature type.
func Manifests(ctx context.Context, t oras.ReadOnlyGraphTarget, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	var out []ocispec.Descriptor
	md, ok, err := tagManifest(ctx, t, desc)
	if err != nil {
		return nil, err
	}
	if ok {
		out = append(out, md)
	}
	refs, _, err := sigReferrers(ctx, t, desc, -1)
	if err != nil {
		return nil, err
	}
	for _, r := range refs {
		if !ok || r.Digest != md.Digest {
			out = append(out, r)
		}
	}
	return out, nil
}

// tagManifest resolves desc's signature tag; ok is false when there is none.
func tagManifest(ctx context.Context, t oras.ReadOnlyGraphTarget, desc ocispec.Descriptor) (ocispec.Descriptor, bool, error) {
	tag := Tag(desc.Digest)
	md, err := t.Resolve(ctx, tag)
	switch {
	case err == nil:
		return md, true, nil
	case errors.Is(err, errdef.ErrNotFound):
		return ocispec.Descriptor{}, false, nil
	}
	return ocispec.Descriptor{}, false, fmt.Errorf("signatures of %s (%s): %w", desc.Digest, tag, err)
}

// sigReferrers lists the signature referrers of desc, at most limit of them
// when limit is not negative (the listing stops there: a registry's pages
// are not all read); more tells whether the registry lists more. The
// listing is bounded as oci.EachReferrer's is.
func sigReferrers(ctx context.Context, t oras.ReadOnlyGraphTarget, desc ocispec.Descriptor, limit int) (out []ocispec.Descriptor, more bool, err error) {
	err = oci.EachReferrer(ctx, t, desc, ArtifactTypeSignature, func(d ocispec.Descriptor) error {
		if limit >= 0 && len(out) == limit {
			more = true
			return oci.StopListing
		}
		out = append(out, d)
		return nil
	})
	if err != nil && !errors.Is(err, errdef.ErrNotFound) && !errors.Is(err, errdef.ErrUnsupported) {
		return nil, false, fmt.Errorf("signature referrers of %s: %w", desc.Digest, err)
	}
	return out, more, nil
}

// sigReader reads the signatures of one version within the bounds above,
// fetching each payload blob once.
type sigReader struct {
	t    oras.ReadOnlyGraphTarget
	desc ocispec.Descriptor

	payloads     map[digest.Digest][]byte // fetched payloads; nil when unusable
	payloadBytes int64                    // bytes of payloads fetched
	seen         map[[32]byte]bool        // (payload, signature) pairs already handed out; nil: hand repeats out too
	skipped      int                      // manifests, entries and payloads left unread by the bounds
}

// newSigReader reads desc's signatures in t; with repeats false, entries
// repeating a payload and signature already handed out are skipped.
func newSigReader(t oras.ReadOnlyGraphTarget, desc ocispec.Descriptor, repeats bool) *sigReader {
	r := &sigReader{t: t, desc: desc, payloads: map[digest.Digest][]byte{}}
	if !repeats {
		r.seen = map[[32]byte]bool{}
	}
	return r
}

// each calls fn for each signature of the version, the tag's first, then
// the referrers', until fn returns true. It returns how many entries fn
// was given.
func (r *sigReader) each(ctx context.Context, fn func(Entry) bool) (int, error) {
	n := 0
	md, ok, err := tagManifest(ctx, r.t, r.desc)
	if err != nil {
		return 0, err
	}
	done := map[digest.Digest]bool{}
	read := func(md ocispec.Descriptor, referrer bool) (bool, error) {
		if done[md.Digest] {
			return false, nil
		}
		done[md.Digest] = true
		m, err := readManifest(ctx, r.t, md)
		if err != nil {
			return false, fmt.Errorf("signatures of %s: %w", r.desc.Digest, err)
		}
		entries := 0
		for _, l := range m.Layers {
			if l.MediaType != MediaTypeSimpleSigning {
				continue
			}
			if entries == maxSigEntries {
				r.skipped++
				continue
			}
			entries++
			if err := ctx.Err(); err != nil {
				return false, err
			}
			e := Entry{Manifest: md, Referrer: referrer, KeyID: l.Annotations[AnnotationKeyID]}
			sig := l.Annotations[AnnotationSignature]
			if r.seen != nil {
				pair := sha256.Sum256([]byte(l.Digest.String() + "\x00" + sig))
				if r.seen[pair] {
					continue
				}
				r.seen[pair] = true
			}
			if e.Sig, err = base64.StdEncoding.DecodeString(sig); err != nil || len(e.Sig) == 0 {
				e.Sig = nil
			}
			if e.Sig != nil {
				e.Payload = r.payload(ctx, l)
			}
			n++
			if fn(e) {
				return true, nil
			}
		}
		return false, nil
	}
	if ok {
		if stop, err := read(md, false); stop || err != nil {
			return n, err
		}
	}
	refs, more, err := sigReferrers(ctx, r.t, r.desc, maxSigManifests-len(done))
	if err != nil {
		return n, err
	}
	if more {
		r.skipped++
	}
	for _, rd := range refs {
		if stop, err := read(rd, true); stop || err != nil {
			return n, err
		}
	}
	return n, nil
}

// payload returns the payload l names, fetched once per digest, or nil
// when it cannot be had: too large, past the bound of payload bytes, or
// not fetched intact.
func (r *sigReader) payload(ctx context.Context, l ocispec.Descriptor) []byte {
	if l.Size <= 0 || l.Size > maxPayload {
		return nil
	}
	if b, ok := r.payloads[l.Digest]; ok {
		return b
	}
	if r.payloadBytes+l.Size > maxPayloads {
		r.skipped++
		return nil
	}
	r.payloadBytes += l.Size
	b, err := verify.Fetch(ctx, r.t, "", l)
	if err != nil {
		b = nil
	}
	r.payloads[l.Digest] = b
	return b
}

// Find returns the signatures of desc stored by tag or as a referrer, as
// far as the bounds of one verification read.
func Find(ctx context.Context, t oras.ReadOnlyGraphTarget, desc ocispec.Descriptor) ([]Entry, error) {
	var out []Entry
	if _, err := newSigReader(t, desc, true).each(ctx, func(e Entry) bool {
		out = append(out, e)
		return false
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// Verified is what Verify found: the signature that verified and its key.
type Verified struct {
	Digest digest.Digest
	KeyID  string
	Entry  Entry
}

// Verify checks that desc carries a valid signature by one of vs. The error
// names the digest and wraps ErrUnsigned, ErrOtherKey, ErrOtherDigest or
// ErrTampered. Signatures are checked as they are read, and reading stops
// at the first valid one; only that one is kept.
func Verify(ctx context.Context, t oras.ReadOnlyGraphTarget, desc ocispec.Descriptor, vs []Verifier) (*Verified, error) {
	if len(vs) == 0 {
		return nil, fmt.Errorf("verify %s: %w: no key given", desc.Digest, ErrKey)
	}
	ids := map[string]bool{}
	for _, v := range vs {
		ids[v.KeyID()] = true
	}
	var (
		found       *Verified
		otherDigest digest.Digest
		tampered    bool
		claims      = map[string]bool{} // short ids, at most one per entry read
	)
	r := newSigReader(t, desc, false)
	n, err := r.each(ctx, func(e Entry) bool {
		if e.KeyID != "" {
			claims[short(e.KeyID)] = true
		}
		var by Verifier
		for _, v := range vs {
			if e.Payload != nil && e.Sig != nil && v.Verify(ctx, e.Payload, e.Sig) == nil {
				by = v
				break
			}
		}
		if by == nil {
			if ids[e.KeyID] {
				tampered = true
			}
			return false
		}
		d, err := signedDigest(e.Payload)
		if err != nil {
			tampered = true
			return false
		}
		if d != desc.Digest {
			otherDigest = d
			return false
		}
		found = &Verified{Digest: desc.Digest, KeyID: by.KeyID(), Entry: e}
		return true
	})
	if err != nil {
		return nil, err
	}
	if found != nil {
		return found, nil
	}
	var bound string
	if r.skipped > 0 {
		bound = fmt.Sprintf("; more signatures than bdnvol reads (%d manifests, %d entries each, %d payload bytes) not read",
			maxSigManifests, maxSigEntries, maxPayloads)
	}
	switch {
	case n == 0:
		return nil, fmt.Errorf("version %s: %w (looked for tag %s and referrers%s)", desc.Digest, ErrUnsigned, Tag(desc.Digest), bound)
	case otherDigest != "":
		return nil, fmt.Errorf("version %s: %w (the signature by the key names %s%s)", desc.Digest, ErrOtherDigest, otherDigest, bound)
	case tampered:
		return nil, fmt.Errorf("version %s: %w (a signature claims key %s but does not verify with it%s)", desc.Digest, ErrTampered, keyList(vs), bound)
	}
	other := make([]string, 0, len(claims))
	for id := range claims {
		other = append(other, short(id))
	}
	slices.Sort(other)
	why := "no signature verifies with key " + keyList(vs)
	if len(other) > maxClaimsShown {
		other = append(other[:maxClaimsShown], fmt.Sprintf("and %d more", len(other)-maxClaimsShown))
	}
	if len(other) > 0 {
		why += "; signatures claim key " + strings.Join(other, ", ")
	}
	return nil, fmt.Errorf("version %s: %w (%d signatures: %s%s)", desc.Digest, ErrOtherKey, n, why, bound)
}

// maxClaimsShown bounds the key ids a refusal lists: the repository
// decides how many signatures claim one.
const maxClaimsShown = 8

func keyList(vs []Verifier) string {
	ids := make([]string, len(vs))
	for i, v := range vs {
		ids[i] = short(v.KeyID())
	}
	return strings.Join(ids, ", ")
}

// Delete removes the signatures of desc: the tag-scheme manifest and the
// signature referrers. It returns how many manifests it deleted.
func Delete(ctx context.Context, t interface {
	oras.ReadOnlyGraphTarget
	content.Deleter
}, desc ocispec.Descriptor) (int, error) {
	mds, err := Manifests(ctx, t, desc)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, md := range mds {
		if err := t.Delete(ctx, md); err != nil && !errors.Is(err, errdef.ErrNotFound) {
			return n, fmt.Errorf("delete signatures %s of %s: %w", md.Digest, desc.Digest, err)
		}
		n++
	}
	return n, nil
}
