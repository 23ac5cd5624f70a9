package warmstate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// ArtifactTypeLease is the artifact type of a publishing lease's manifest.
const ArtifactTypeLease = "application/vnd.bdnvol.warmstate.lease.v1"

// Annotations of a lease manifest.
const (
	AnnotationLeaseHolder  = "dev.bdnvol.warmstate.lease.holder"
	AnnotationLeaseExpires = "dev.bdnvol.warmstate.lease.expires"
)

// LeaseTagPrefix starts the tag of a publishing lease.
const LeaseTagPrefix = "warmstate-lease-"

// DefaultLeaseTTL is how long a lease holds when PublishOptions leaves it 0.
const DefaultLeaseTTL = 30 * time.Minute

// ErrLeased is wrapped when another publisher holds the lease of the key.
var ErrLeased = errors.New("another publisher holds the lease of this key")

// PublishOptions configure Publish.
type PublishOptions struct {
	Push   push.Options     // how the tree is sealed (Cache, Jobs, Counters); Annotations are refused
	Signer signature.Signer // signs the companion's digest when set
	Repo   string           // the repository named in the signature's payload (signature.RepoName)
	// Policy says which companions already there count: with keys, only
	// signed ones (the signer's own key is added).
	Policy   signature.Policy
	Holder   string        // who publishes (a pod or host name), recorded in the lease
	LeaseTTL time.Duration // how long the lease holds; 0 means DefaultLeaseTTL
	Now      func() time.Time
}

// Published is what Publish did.
type Published struct {
	Companion Companion
	// Existed: a companion of the key was there already; nothing was
	// pushed.
	Existed bool
	// Lost: this publisher pushed a companion, but another of the same key
	// pushed meanwhile had the lower digest; this one was deleted and
	// Companion is the other.
	Lost bool
	Push *push.Result // the tree's push; nil when nothing was pushed
}

// LeaseTag returns the tag of the publishing lease of key for the version
// subject.
func LeaseTag(subject ocispec.Descriptor, key Key) string {
	s := sha256.Sum256([]byte(subject.Digest.String() + "\n" + key.String()))
	return LeaseTagPrefix + hex.EncodeToString(s[:24])
}

// Publish seals the tree src (push.Push: its chunks dedup against all t
// holds, earlier companions included) and attaches it to the version
// subject as the companion of key, once per key:
//
//   - a companion of the key already there (that opt.Policy accepts) is
//     returned and nothing is pushed: companions are never updated in place;
//   - a lease tag (LeaseTag) held by another publisher and not expired
//     fails with ErrLeased before anything is pushed; else this publisher
//     takes it and reads it back;
//   - after attaching (and signing), the companions of the key are listed
//     again and all but the one of the lowest digest are deleted, so two
//     publishers that both got past the lease (registries have no
//     compare-and-swap on tags) still leave one, the same for both;
//   - the lease is released.
func Publish(ctx context.Context, t oci.Target, subject ocispec.Descriptor, key Key, src push.Source, opt PublishOptions) (*Published, error) {
	if len(opt.Push.Annotations) > 0 {
		return nil, errors.New("warm state: the tree takes no annotations; the key is the companion's")
	}
	if opt.Signer != nil {
		opt.Policy.Keys = append(opt.Policy.Keys, opt.Signer.Verifier())
	}
	now := time.Now
	if opt.Now != nil {
		now = opt.Now
	}
	if opt.LeaseTTL <= 0 {
		opt.LeaseTTL = DefaultLeaseTTL
	}
	if c, err := Find(ctx, t, subject, key, opt.Policy); err == nil {
		return &Published{Companion: *c, Existed: true}, nil
	} else if !errors.Is(err, ErrNotFound) && !errors.Is(err, signature.ErrRefused) {
		return nil, err
	}
	lease, err := takeLease(ctx, t, subject, key, opt.Holder, now(), opt.LeaseTTL)
	if err != nil {
		return nil, err
	}
	defer func() {
		// Released on every way out; a lease left behind expires.
		_ = t.Delete(context.WithoutCancel(ctx), lease)
	}()
	res, err := push.Push(ctx, t, src, opt.Push)
	if err != nil {
		return nil, fmt.Errorf("warm state of %s: %w", subject.Digest, err)
	}
	d, err := Attach(ctx, t, subject, res.Root, key)
	if err != nil {
		return nil, err
	}
	if opt.Signer != nil {
		if _, err := signature.Sign(ctx, t, opt.Repo, d, opt.Signer); err != nil {
			return nil, fmt.Errorf("sign companion %s: %w", d.Digest, err)
		}
	}
	return settle(ctx, t, subject, key, d, res, opt.Policy)
}

// settle keeps the companion of key with the lowest digest and deletes the
// others that count under p (this publisher's own always counts).
func settle(ctx context.Context, t oci.Target, subject ocispec.Descriptor, key Key, mine ocispec.Descriptor, res *push.Result, p signature.Policy) (*Published, error) {
	cs, err := List(ctx, t, subject)
	if err != nil {
		return nil, err
	}
	var keep *Companion
	var errs []error
	for _, c := range Matches(cs, key) {
		if c.Desc.Digest != mine.Digest && p.Check(ctx, t, c.Desc) != nil {
			continue // not one of those that count: left alone
		}
		if keep == nil {
			keep = &c
			continue
		}
		if err := Delete(ctx, t, c.Desc); err != nil {
			errs = append(errs, err)
		}
	}
	if keep == nil {
		return nil, fmt.Errorf("companion %s of %s: gone right after it was attached", mine.Digest, subject.Digest)
	}
	return &Published{Companion: *keep, Lost: keep.Desc.Digest != mine.Digest, Push: res}, errors.Join(errs...)
}

type leaseDoc struct {
	holder  string
	expires time.Time
}

// takeLease writes the lease of key as this holder's, unless another
// holds it unexpired, and reads it back.
func takeLease(ctx context.Context, t oci.Target, subject ocispec.Descriptor, key Key, holder string, now time.Time, ttl time.Duration) (ocispec.Descriptor, error) {
	tag := LeaseTag(subject, key)
	if l, ok, err := readLease(ctx, t, tag); err != nil {
		return ocispec.Descriptor{}, err
	} else if ok && l.holder != holder && now.Before(l.expires) {
		return ocispec.Descriptor{}, fmt.Errorf("%s %s: %w (%s, until %s)", subject.Digest, key, ErrLeased, l.holder, l.expires.Format(time.RFC3339))
	}
	// The nonce makes each take a distinct manifest, so that reading the
	// tag back tells whose write won.
	nonce := fmt.Sprintf("%d", now.UnixNano())
	m := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactTypeLease,
		Config:       ocispec.DescriptorEmptyJSON,
		Layers:       []ocispec.Descriptor{},
		Annotations: map[string]string{
			AnnotationLeaseHolder:              holder,
			AnnotationLeaseExpires:             now.Add(ttl).UTC().Format(time.RFC3339Nano),
			AnnotationKey:                      key.String(),
			"dev.bdnvol.warmstate.lease.nonce": nonce,
		},
	}
	m.Config.Data = nil
	b, err := json.Marshal(m)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := pushBytes(ctx, t, ocispec.DescriptorEmptyJSON, []byte("{}")); err != nil {
		return ocispec.Descriptor{}, err
	}
	d := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, b)
	if err := pushBytes(ctx, t, d, b); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("lease %s: %w", tag, err)
	}
	if err := oci.TagBytes(ctx, t, d, b, tag); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("lease %s: %w", tag, err)
	}
	got, err := t.Resolve(ctx, tag)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("lease %s: %w", tag, err)
	}
	if got.Digest != d.Digest {
		l, _, _ := readLease(ctx, t, tag)
		return ocispec.Descriptor{}, fmt.Errorf("%s %s: %w (%s)", subject.Digest, key, ErrLeased, l.holder)
	}
	return d, nil
}

func readLease(ctx context.Context, t oci.Target, tag string) (leaseDoc, bool, error) {
	d, b, err := oci.FetchManifest(ctx, t, oci.Ref{Tag: tag}, 64<<10)
	if errors.Is(err, oci.ErrNotFound) {
		return leaseDoc{}, false, nil
	}
	if err != nil {
		return leaseDoc{}, false, fmt.Errorf("lease %s: %w", tag, err)
	}
	// A registry that keeps a tag of a manifest deleted by digest (a
	// released lease) still serves it by the tag: ask by digest.
	if ok, err := t.Exists(ctx, d); err == nil && !ok {
		return leaseDoc{}, false, nil
	}
	var m ocispec.Manifest
	if json.Unmarshal(b, &m) != nil || m.ArtifactType != ArtifactTypeLease {
		return leaseDoc{}, false, fmt.Errorf("lease %s: %s is not a lease", tag, d.Digest)
	}
	exp, err := time.Parse(time.RFC3339Nano, m.Annotations[AnnotationLeaseExpires])
	if err != nil {
		return leaseDoc{}, false, nil // unreadable: treated as expired
	}
	return leaseDoc{holder: m.Annotations[AnnotationLeaseHolder], expires: exp}, true, nil
}
