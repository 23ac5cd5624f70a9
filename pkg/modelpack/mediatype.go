package modelpack

import "strings"

// The names of the CNCF ModelPack format (github.com/modelpack/model-spec,
// docs/spec.md and docs/annotations.md), written out here so that bdnvol
// depends on no module of that project.

// ArtifactType is the artifactType of a ModelPack manifest.
const ArtifactType = "application/vnd.cncf.model.manifest.v1+json"

// MediaTypeConfig is the media type of a ModelPack manifest's config blob.
const MediaTypeConfig = "application/vnd.cncf.model.config.v1+json"

// The names of the format before it moved to the CNCF (CNAI, read only:
// modctl still extracts such artifacts and registries hold many). bdnvol
// writes only the CNCF names.
const (
	// LegacyArtifactType is the artifactType of a pre-CNCF model manifest.
	LegacyArtifactType = "application/vnd.cnai.model.manifest.v1+json"
	// LegacyMediaTypeConfig is the media type of a pre-CNCF model's config.
	LegacyMediaTypeConfig = "application/vnd.cnai.model.config.v1+json"
	// LegacyAnnotationFilepath is AnnotationFilepath before the CNCF.
	LegacyAnnotationFilepath = "org.cnai.model.filepath"
	// LegacyAnnotationFileMetadata is AnnotationFileMetadata before the CNCF.
	LegacyAnnotationFileMetadata = "org.cnai.model.file.metadata+json"
	legacyMediaTypePrefix        = "application/vnd.cnai.model."
)

// Layer annotation keys of the format.
const (
	// AnnotationFilepath is the path of the file (a .raw layer) or of the
	// directory the tar unpacks into (a .tar layer), relative to the model's root.
	AnnotationFilepath = "org.cncf.model.filepath"
	// AnnotationFileMetadata is a JSON object (FileMetadata) describing the file of a .raw layer.
	AnnotationFileMetadata = "org.cncf.model.file.metadata+json"
	// AnnotationMediaTypeUntested marks a layer whose media type the builder did not check.
	AnnotationMediaTypeUntested = "org.cncf.model.file.mediatype.untested"
	// AnnotationTitle is the OCI title annotation; oras pull writes a layer to this name.
	AnnotationTitle = "org.opencontainers.image.title"
)

// Kind is what a layer holds, the middle word of its media type.
type Kind string

// The kinds of layer the format names.
const (
	KindWeight       Kind = "weight"
	KindWeightConfig Kind = "weight.config"
	KindDoc          Kind = "doc"
	KindCode         Kind = "code"
	KindDataset      Kind = "dataset"
)

// Kinds lists every kind, in the spec's order.
var Kinds = []Kind{KindWeight, KindWeightConfig, KindDoc, KindCode, KindDataset}

// Packing is how a layer stores its files, the suffix of its media type.
type Packing string

// The packings the format names.
const (
	// PackingRaw is one file stored as it is: range-readable.
	PackingRaw Packing = "raw"
	// PackingTar is an uncompressed tar: range-readable once its headers are read.
	PackingTar Packing = "tar"
	// PackingTarGzip is a gzip-compressed tar: readable only whole, from the start.
	PackingTarGzip Packing = "tar+gzip"
	// PackingTarZstd is a zstd-compressed tar: readable only whole, from the start.
	PackingTarZstd Packing = "tar+zstd"
)

// Packings lists every packing.
var Packings = []Packing{PackingRaw, PackingTar, PackingTarGzip, PackingTarZstd}

// mediaTypePrefix and mediaTypeVersion frame a layer media type:
// application/vnd.cncf.model.<kind>.v1.<packing>.
const (
	mediaTypePrefix  = "application/vnd.cncf.model."
	mediaTypeVersion = ".v1."
)

// MediaType returns the layer media type of kind k packed as p.
func MediaType(k Kind, p Packing) string {
	return mediaTypePrefix + string(k) + mediaTypeVersion + string(p)
}

// Layer media types bdnvol writes (export) and reads most; every other
// combination of Kinds and Packings is read as well (ParseMediaType).
var (
	MediaTypeWeightRaw       = MediaType(KindWeight, PackingRaw)
	MediaTypeWeightTar       = MediaType(KindWeight, PackingTar)
	MediaTypeWeightConfigRaw = MediaType(KindWeightConfig, PackingRaw)
	MediaTypeDocRaw          = MediaType(KindDoc, PackingRaw)
	MediaTypeCodeRaw         = MediaType(KindCode, PackingRaw)
)

// ParseMediaType splits a ModelPack layer media type (CNCF, or the
// pre-CNCF CNAI names) into its kind and packing; ok is false for any
// other media type.
func ParseMediaType(mt string) (k Kind, p Packing, ok bool) {
	rest, found := strings.CutPrefix(mt, mediaTypePrefix)
	if !found {
		if rest, found = strings.CutPrefix(mt, legacyMediaTypePrefix); !found {
			return "", "", false
		}
	}
	kind, packing, found := strings.Cut(rest, mediaTypeVersion)
	if !found {
		return "", "", false
	}
	k, p = Kind(kind), Packing(packing)
	if !contains(Kinds, k) || !contains(Packings, p) {
		return "", "", false
	}
	return k, p, true
}

// RangeReadable reports whether a packing's bytes can be read at an offset
// without reading what comes before (raw and uncompressed tar).
func (p Packing) RangeReadable() bool { return p == PackingRaw || p == PackingTar }

// IsTar reports whether a packing is a tar archive (compressed or not).
func (p Packing) IsTar() bool { return p != PackingRaw }

func contains[T comparable](list []T, v T) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
