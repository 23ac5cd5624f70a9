package signature

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// ErrRefused is wrapped when a policy refuses a version.
var ErrRefused = errors.New("refused: signature required")

// Policy is what a version must carry to be used. The zero Policy requires
// nothing.
type Policy struct {
	// Keys: a valid signature by any one of them is required when not empty.
	Keys []Verifier
}

// Required reports whether the policy requires a signature.
func (p Policy) Required() bool { return len(p.Keys) > 0 }

// Check returns nil when p requires nothing or desc carries a valid signature
// by one of p's keys. Only the signature manifests and payloads are read.
func (p Policy) Check(ctx context.Context, t oci.Target, desc ocispec.Descriptor) error {
	if !p.Required() {
		return nil
	}
	if _, err := Verify(ctx, t, desc, p.Keys); err != nil {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return nil
}

// Resolve resolves ref in t and checks the version against p before anything
// of it is read: the one place where pull, mount and the node plugin turn a
// reference into a digest they will use. It GETs the manifest and computes
// the digest from its bytes (see oci.FetchManifest): what a registry claims
// in a header is never trusted.
func Resolve(ctx context.Context, t oci.Target, ref oci.Ref, p Policy) (ocispec.Descriptor, error) {
	desc, _, err := ResolveBytes(ctx, t, ref, p, oci.MaxManifestBytes)
	return desc, err
}

// ResolveBytes is Resolve that also returns the manifest's bytes, verified
// against the descriptor (see oci.FetchManifest).
func ResolveBytes(ctx context.Context, t oci.Target, ref oci.Ref, p Policy, maxBytes int64) (ocispec.Descriptor, []byte, error) {
	desc, b, err := oci.FetchManifest(ctx, t, ref, maxBytes)
	if err != nil {
		return desc, nil, err
	}
	if err := p.Check(ctx, t, desc); err != nil {
		return ocispec.Descriptor{}, nil, fmt.Errorf("%s: %w", ref.Pinned(desc.Digest), err)
	}
	return desc, b, nil
}

// LoadPolicy returns the policy requiring a signature by one of the public
// key files named; no names, no requirement.
func LoadPolicy(paths ...string) (Policy, error) {
	var p Policy
	for _, path := range paths {
		if path == "" {
			continue
		}
		v, err := LoadPublicKey(path, nil)
		if err != nil {
			return Policy{}, err
		}
		p.Keys = append(p.Keys, v)
	}
	return p, nil
}

// ErrKeyName is wrapped, with one and the same message whatever the cause,
// when a key named by a file name in a volume attribute is refused: so that
// the attribute tells a pod nothing about which paths exist on the node.
var ErrKeyName = errors.New("a key file is used only when it names a PEM public key under the node plugin's key directory " +
	"(none by default); give the key inline as PEM")

// PolicyFromValue reads a key given inline as a PEM public key (a value
// starting with "-----BEGIN") or named as a file under keyDir, as the node
// plugin's volume attribute allows. The name is relative to keyDir or an
// absolute path beneath it, and is opened beneath keyDir (os.Root: no
// "..", no symbolic link out of it). Without keyDir no file is read. Every
// refusal of a file name is ErrKeyName alone.
func PolicyFromValue(s, keyDir string) (Policy, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Policy{}, nil
	}
	if strings.HasPrefix(s, "-----BEGIN") {
		v, err := ParsePublicKey([]byte(s))
		if err != nil {
			return Policy{}, fmt.Errorf("inline key: %w", err)
		}
		return Policy{Keys: []Verifier{v}}, nil
	}
	v, err := loadKeyIn(keyDir, s)
	if err != nil {
		return Policy{}, fmt.Errorf("%w: %w", ErrKey, ErrKeyName)
	}
	return Policy{Keys: []Verifier{v}}, nil
}

// loadKeyIn reads the public key file name beneath dir.
func loadKeyIn(dir, name string) (Verifier, error) {
	if dir == "" {
		return nil, ErrKeyName
	}
	if filepath.IsAbs(name) {
		rel, err := filepath.Rel(dir, name)
		if err != nil || !filepath.IsLocal(rel) {
			return nil, ErrKeyName
		}
		name = rel
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	f, err := root.OpenFile(name, os.O_RDONLY|openFlags, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := readRegular(f)
	if err != nil {
		return nil, err
	}
	return ParsePublicKey(b)
}
