package imageview

import (
	"context"
	"fmt"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Exported is an image view built and pushed by Export.
type Exported struct {
	Image         string          `json:"image"`    // REPO[:TAG]@DIGEST where it was pushed
	Digest        string          `json:"digest"`   // of its manifest
	Attached      string          `json:"attached"` // the referrer in the volume's repository
	Volume        string          `json:"volume"`   // the version's pinned reference
	VolumeBytes   int64           `json:"volume_bytes"`
	ImageBytes    int64           `json:"image_bytes"`
	BytesUploaded int64           `json:"bytes_uploaded"`
	Seconds       float64         `json:"seconds"`
	Layers        []ExportedLayer `json:"layers"`

	VolumeDigest   digest.Digest `json:"-"`
	LayersUploaded int           `json:"-"` // layers pushed to a destination that lacked them
}

// ExportedLayer is one layer of an exported image view.
type ExportedLayer struct {
	Digest   string `json:"digest"`
	Size     int64  `json:"size"`
	Files    int    `json:"files"`
	Bytes    int64  `json:"bytes"`
	Uploaded bool   `json:"uploaded"`
}

// Export builds the image view of version root (rootBytes of files) of the
// repository ref names, opened as t, and attaches it there as a referrer.
// When dst names another repository (opened with dstOpt, a layout created
// if missing) the image is pushed there too; a tag of dst is pointed at
// it. A zero dst is the volume's repository, untagged; a dst with a digest
// is refused (ErrDestinationDigest).
func Export(ctx context.Context, t oci.Target, ref oci.Ref, root ocispec.Descriptor, rootBytes int64, dst oci.Ref, dstOpt oci.Options, opt Options) (*Exported, error) {
	if dst.Digest != "" {
		return nil, fmt.Errorf("%s: %w", dst, ErrDestinationDigest)
	}
	start := time.Now()
	ver, err := layout.Open(ctx, t, root)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	imgT := t
	dsts := []Dest{t}
	if dst == (oci.Ref{}) {
		dst = ref
		dst.Tag, dst.Digest = "", ""
	} else if dst.Repo() != ref.Repo() {
		dstOpt.CreateLayout = true
		if imgT, err = oci.Open(ctx, dst, dstOpt); err != nil {
			return nil, err
		}
		// A referrer lives in its subject's repository: push there too.
		dsts = []Dest{imgT, t}
	}
	img, err := Build(ctx, t, ver, dsts, opt)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref.Pinned(root.Digest), err)
	}
	if dst.Tag != "" {
		if err := oci.TagBytes(ctx, imgT, img.Manifest, img.ManifestBytes, dst.Tag); err != nil {
			return nil, fmt.Errorf("%s: %w", dst, err)
		}
	}
	image := dst.Repo()
	if dst.Tag != "" {
		image += ":" + dst.Tag
	}
	out := &Exported{
		Image:         image + "@" + img.Manifest.Digest.String(),
		Digest:        img.Manifest.Digest.String(),
		Attached:      ref.Pinned(img.Manifest.Digest),
		Volume:        ref.Pinned(root.Digest),
		VolumeBytes:   rootBytes,
		BytesUploaded: img.BytesUploaded,
		Layers:        []ExportedLayer{},
		VolumeDigest:  root.Digest,
	}
	for _, l := range img.Layers {
		out.ImageBytes += l.Desc.Size
		out.Layers = append(out.Layers, ExportedLayer{Digest: l.Desc.Digest.String(), Size: l.Desc.Size, Files: l.Files, Bytes: l.Bytes, Uploaded: l.Uploaded})
		if l.Uploaded {
			out.LayersUploaded++
		}
	}
	out.ImageBytes += img.Config.Size + img.Manifest.Size
	out.Seconds = time.Since(start).Seconds()
	return out, nil
}
