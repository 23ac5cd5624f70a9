package modelpack

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Sentinel errors, each wrapped with the artifact and the layer or path it
// is about.
var (
	// ErrInvalid is wrapped by every error about a malformed or unsafe
	// artifact: its manifest, a layer, a tar entry or a path.
	ErrInvalid = errors.New("modelpack: invalid artifact")
	// ErrNotModel is wrapped when a manifest is not one this package reads.
	ErrNotModel = errors.New("modelpack: not a model artifact")
)

// Limits bounding what a manifest makes this package hold or read.
const (
	// MaxLayers bounds the layers of one manifest.
	MaxLayers = 10_000
	// MaxFiles bounds the files of one artifact, over all its layers.
	MaxFiles = 1_000_000
	// MaxLayerBytes bounds the size a layer descriptor may claim (16 TiB).
	MaxLayerBytes = 16 << 40
)

// OCI image layer media types read as tars (an image whose layers are
// files is read as well: see Layer).
const (
	mediaTypeImageTar     = ocispec.MediaTypeImageLayer
	mediaTypeImageTarGzip = ocispec.MediaTypeImageLayerGzip
	mediaTypeImageTarZstd = ocispec.MediaTypeImageLayerZstd
)

// FileMetadata is the value of the AnnotationFileMetadata annotation.
type FileMetadata struct {
	Name     string `json:"name"`
	Mode     uint32 `json:"mode"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
	Size     int64  `json:"size"`
	Typeflag byte   `json:"typeflag"`
}

// Layer is one layer of an artifact, classified.
type Layer struct {
	Desc    ocispec.Descriptor
	Kind    Kind    // "" for a layer of a plain OCI image
	Packing Packing // how the layer holds its files
	// Path is the file of a raw layer, from the file-path (or else the
	// title) annotation; for a tar layer, what the annotation says (the
	// tar's own names are the paths).
	Path string
	// Mode is the permission bits of a raw layer's file (0644 unless its
	// metadata annotation says otherwise).
	Mode uint32
}

// Artifact is a model artifact's manifest, checked and classified.
type Artifact struct {
	Desc     ocispec.Descriptor // the manifest
	Manifest ocispec.Manifest
	Layers   []Layer
}

// IsModel reports whether a manifest is a ModelPack model (CNCF or the
// pre-CNCF CNAI format) by its artifact type or, for builders that leave
// that out, its config's media type.
func IsModel(m ocispec.Manifest) bool {
	switch {
	case m.ArtifactType == ArtifactType || m.ArtifactType == LegacyArtifactType:
		return true
	}
	return m.Config.MediaType == MediaTypeConfig || m.Config.MediaType == LegacyMediaTypeConfig
}

// Fetch fetches the manifest desc from src, verified, and parses it.
func Fetch(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (*Artifact, error) {
	if desc.Size <= 0 || desc.Size > layout.MaxManifestBytes {
		return nil, fmt.Errorf("manifest %s: %w: size %d", desc.Digest, ErrInvalid, desc.Size)
	}
	b, err := verify.Fetch(ctx, src, "manifest", desc)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return Parse(desc, b)
}

// Parse parses the manifest b (whose descriptor is desc): an OCI image
// manifest whose layers each are one file or a tar of files. Any other
// layer is refused with an error that names it.
func Parse(desc ocispec.Descriptor, b []byte) (*Artifact, error) {
	var m ocispec.Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w: %v", desc.Digest, ErrInvalid, err)
	}
	if m.MediaType != "" && m.MediaType != ocispec.MediaTypeImageManifest {
		return nil, fmt.Errorf("manifest %s: media type %s: %w", desc.Digest, termsafe.Short(m.MediaType), ErrNotModel)
	}
	if len(m.Layers) > MaxLayers {
		return nil, fmt.Errorf("manifest %s: %w: %d layers, more than %d", desc.Digest, ErrInvalid, len(m.Layers), MaxLayers)
	}
	a := &Artifact{Desc: desc, Manifest: m, Layers: make([]Layer, 0, len(m.Layers))}
	for i, d := range m.Layers {
		l, err := classify(d)
		if err != nil {
			return nil, fmt.Errorf("manifest %s: layer %d (%s): %w", desc.Digest, i, d.Digest, err)
		}
		a.Layers = append(a.Layers, l)
	}
	return a, nil
}

// classify checks a layer descriptor and says how it holds its files.
func classify(d ocispec.Descriptor) (Layer, error) {
	if d.Digest.Validate() != nil || d.Digest.Algorithm() != digest.SHA256 {
		return Layer{}, fmt.Errorf("%w: digest %s is not a sha256 digest", ErrInvalid, termsafe.Short(string(d.Digest)))
	}
	if d.Size < 0 || d.Size > MaxLayerBytes {
		return Layer{}, fmt.Errorf("%w: size %d outside 0…%d", ErrInvalid, d.Size, int64(MaxLayerBytes))
	}
	l := Layer{Desc: d, Mode: 0o644}
	l.Path = d.Annotations[AnnotationFilepath]
	if l.Path == "" {
		l.Path = d.Annotations[LegacyAnnotationFilepath]
	}
	if l.Path == "" {
		l.Path = d.Annotations[AnnotationTitle]
	}
	var ok bool
	switch d.MediaType {
	case mediaTypeImageTar, ocispec.MediaTypeImageLayerNonDistributable: //nolint:staticcheck // read as any tar
		l.Packing = PackingTar
	case mediaTypeImageTarGzip:
		l.Packing = PackingTarGzip
	case mediaTypeImageTarZstd:
		l.Packing = PackingTarZstd
	default:
		if l.Kind, l.Packing, ok = ParseMediaType(d.MediaType); !ok {
			if l.Path == "" {
				return Layer{}, fmt.Errorf("%w: media type %s is neither a model layer nor a file with a title", ErrInvalid, termsafe.Short(d.MediaType))
			}
			l.Packing = PackingRaw // a file pushed as it is (oras push)
		}
	}
	if l.Packing != PackingRaw {
		return l, nil
	}
	p, err := CheckPath(l.Path)
	if err != nil {
		return Layer{}, err
	}
	l.Path = p
	mj := d.Annotations[AnnotationFileMetadata]
	if mj == "" {
		mj = d.Annotations[LegacyAnnotationFileMetadata]
	}
	if mj != "" {
		var fm FileMetadata
		if err := json.Unmarshal([]byte(mj), &fm); err != nil {
			return Layer{}, fmt.Errorf("%w: %s: %v", ErrInvalid, AnnotationFileMetadata, err)
		}
		if fm.Typeflag != 0 && fm.Typeflag != '0' {
			return Layer{}, fmt.Errorf("%w: %s: file metadata gives type %q, not a regular file", ErrInvalid, termsafe.Short(p), fm.Typeflag)
		}
		l.Mode = fileMode(fm.Mode)
	}
	return l, nil
}

// TarMode returns the mode of the file of tar header h as a model's
// file: the permission bits it gives (see fileMode).
func TarMode(h *tar.Header) uint32 { return fileMode(uint32(h.Mode & 0o7777)) }

// fileMode keeps the permission bits the artifact gives (0777, as push
// keeps them; no setuid, setgid or sticky bit), readable by the owner.
func fileMode(m uint32) uint32 {
	m &= 0o777
	return m | 0o400
}

// CheckPath returns p (a path inside the model, as an annotation or a tar
// header gives it) in the slash form of a bdnvol index, or an error wrapping
// ErrInvalid if the index would refuse it: empty, absolute, with a ".."
// element, or a name bdnvol reserves. A leading "./" is dropped.
func CheckPath(p string) (string, error) {
	orig := p
	for strings.HasPrefix(p, "./") {
		p = p[2:]
	}
	p = strings.TrimSuffix(p, "/")
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("%w: path %s %s", ErrInvalid, termsafe.Short(orig), why)
	}
	switch {
	case p == "" || p == ".":
		return bad("is empty")
	case strings.HasPrefix(p, "/"):
		return bad("is absolute")
	case strings.Contains(p, "\\"):
		return bad("has a backslash")
	case strings.ContainsRune(p, 0):
		return bad("has a NUL byte")
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return bad("leaves the model's root")
		}
	}
	if path.Clean(p) != p {
		return bad("is not clean")
	}
	if layout.Reserved(p) {
		return bad("is a name bdnvol reserves")
	}
	return p, nil
}
