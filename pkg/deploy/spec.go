package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// FileName is the conventional name of a deploy file.
const FileName = "bdnvol.yaml"

// ErrInvalidSpec is wrapped by every error about a malformed deploy file.
var ErrInvalidSpec = errors.New("invalid deploy file")

// Spec is a deploy file: the volumes a workload mounts.
type Spec struct {
	Mounts []Mount `yaml:"mounts" json:"mounts"`
	// RequireSignature names a cosign public key file (relative paths are
	// relative to the deploy file) that every mount's version must be
	// signed by, unless the mount names its own.
	RequireSignature string `yaml:"requireSignature,omitempty" json:"requireSignature,omitempty"`
}

// Mount is one volume to mount.
type Mount struct {
	Source   string `yaml:"source" json:"source"`     // a volume reference with a tag or a digest
	Path     string `yaml:"path" json:"path"`         // absolute mount point
	ReadOnly bool   `yaml:"readOnly" json:"readOnly"` // mount read-only
	// RequireSignature names the public key file this mount's version must
	// be signed by; it replaces the spec's.
	RequireSignature string `yaml:"requireSignature,omitempty" json:"requireSignature,omitempty"`
}

// SignatureKey returns the key file mount i requires a signature by, "" for
// none: the mount's own, else the spec's.
func (s *Spec) SignatureKey(i int) string {
	if k := s.Mounts[i].RequireSignature; k != "" {
		return k
	}
	return s.RequireSignature
}

// Parse decodes and validates a deploy file (YAML or JSON). Unknown fields
// are refused so that a typo does not silently drop a setting.
func Parse(b []byte) (*Spec, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var s Spec
	if err := dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty", ErrInvalidSpec)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Validate checks that every mount has a parseable source with a tag or a
// digest and a distinct, clean, absolute path.
func (s *Spec) Validate() error {
	if len(s.Mounts) == 0 {
		return fmt.Errorf("%w: no mounts", ErrInvalidSpec)
	}
	seen := map[string]bool{}
	for i, m := range s.Mounts {
		r, err := oci.ParseRef(m.Source)
		if err != nil {
			return fmt.Errorf("%w: mount %d: source: %v", ErrInvalidSpec, i, err)
		}
		if r.Reference() == "" {
			return fmt.Errorf("%w: mount %d: source %q has no tag or digest", ErrInvalidSpec, i, m.Source)
		}
		if !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path || m.Path == "/" {
			return fmt.Errorf("%w: mount %d: path %q must be a clean absolute path other than /", ErrInvalidSpec, i, m.Path)
		}
		if seen[m.Path] {
			return fmt.Errorf("%w: mount %d: path %q mounted twice", ErrInvalidSpec, i, m.Path)
		}
		seen[m.Path] = true
	}
	return nil
}

// Target is one mount of a spec placed under a root directory.
type Target struct {
	Ref        oci.Ref
	Path       string // as the spec gives it
	Mountpoint string // root/<path>
	ReadOnly   bool   // as the spec asked
}

// Targets places the mounts of s under the directory root, each at
// root/<path>. A mount inside another is refused.
func (s *Spec) Targets(root string) ([]Target, error) {
	out := make([]Target, 0, len(s.Mounts))
	for i, m := range s.Mounts {
		ref, err := oci.ParseRef(m.Source)
		if err != nil {
			return nil, fmt.Errorf("%w: mount %d: source: %w", ErrInvalidSpec, i, err)
		}
		out = append(out, Target{Ref: ref, Path: m.Path, Mountpoint: filepath.Join(root, filepath.FromSlash(m.Path)), ReadOnly: m.ReadOnly})
	}
	for _, a := range out {
		for _, b := range out {
			if a.Mountpoint != b.Mountpoint && strings.HasPrefix(b.Mountpoint, a.Mountpoint+string(filepath.Separator)) {
				return nil, fmt.Errorf("%w: %s is inside %s; nested mounts are not supported", ErrInvalidSpec, b.Mountpoint, a.Mountpoint)
			}
		}
	}
	return out, nil
}
