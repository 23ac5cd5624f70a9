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
	ver, err := layout.OpenWith(ctx, t, root, layout.OpenOptions{Foreign: opt.Foreign})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	imgT, dsts, dst, err := Destinations(ctx, t, ref, dst, dstOpt)
	if err != nil {
		return nil, err
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
	out := &Exported{
		Image:         Named(dst, img.Manifest.Digest),
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

// Destinations returns where a view of a version in t (the repository ref
// names) is pushed: t, and the target dst names when it is another
// repository (opened with dstOpt, a layout created if missing; a referrer
// lives in its subject's repository, so t too). The first target is the
// one a tag of dst goes to; a zero dst becomes ref's repository, untagged.
func Destinations(ctx context.Context, t oci.Target, ref, dst oci.Ref, dstOpt oci.Options) (oci.Target, []Dest, oci.Ref, error) {
	if dst == (oci.Ref{}) {
		dst = ref
		dst.Tag, dst.Digest = "", ""
		return t, []Dest{t}, dst, nil
	}
	if dst.Repo() == ref.Repo() {
		return t, []Dest{t}, dst, nil
	}
	dstOpt.CreateLayout = true
	imgT, err := oci.Open(ctx, dst, dstOpt)
	if err != nil {
		return nil, nil, dst, err
	}
	return imgT, []Dest{imgT, t}, dst, nil
}

// Named is REPO[:TAG]@DIGEST of the manifest d pushed to dst.
func Named(dst oci.Ref, d digest.Digest) string {
	image := dst.Repo()
	if dst.Tag != "" {
		image += ":" + dst.Tag
	}
	return image + "@" + d.String()
}
