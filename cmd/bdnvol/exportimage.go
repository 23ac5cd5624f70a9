package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// ExportImageCmd builds the image view of a version.
type ExportImageCmd struct {
	Ref       string `arg:"" help:"The version: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	ImageRef  string `arg:"" optional:"" name:"image-ref" help:"Where to push the image: HOST/REPO[:TAG] or oci:PATH[:TAG] (default: the volume's repository, untagged)."`
	Root      string `default:"models" help:"Directory of the image that holds the version's tree."`
	LayerSize Size   `name:"layer-size" default:"512MiB" help:"Most file bytes in one layer; a larger file gets a layer of its own."`
	Platform  string `default:"linux/amd64" help:"OS/ARCH written in the image config."`
	JSON      bool   `name:"json" help:"Print one JSON object instead of text."`
}

// exportedImage is what export-image --json prints.
type exportedImage struct {
	Image         string          `json:"image"`
	Digest        string          `json:"digest"`
	Attached      string          `json:"attached"` // the referrer in the volume's repository
	Volume        string          `json:"volume"`
	VolumeBytes   int64           `json:"volume_bytes"`
	ImageBytes    int64           `json:"image_bytes"`
	BytesUploaded int64           `json:"bytes_uploaded"`
	Seconds       float64         `json:"seconds"`
	Layers        []exportedLayer `json:"layers"`
}

type exportedLayer struct {
	Digest   string `json:"digest"`
	Size     int64  `json:"size"`
	Files    int    `json:"files"`
	Bytes    int64  `json:"bytes"`
	Uploaded bool   `json:"uploaded"`
}

// Run builds and pushes the image.
func (c *ExportImageCmd) Run(ctx context.Context, g *Globals) error {
	start := time.Now()
	osName, arch, ok := strings.Cut(c.Platform, "/")
	if !ok || osName == "" || arch == "" || strings.Contains(arch, "/") {
		return usageError{fmt.Errorf("--platform %q: want OS/ARCH", c.Platform)}
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	ver, err := layout.Open(ctx, t, root.Desc)
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	dst, imgT := ref, t
	dst.Tag, dst.Digest = "", ""
	dsts := []imageview.Dest{t}
	if c.ImageRef != "" {
		if dst, err = oci.ParseRef(c.ImageRef); err != nil {
			return usageError{err}
		}
		if dst.Digest != "" {
			return usageError{fmt.Errorf("%s: an image reference takes a tag, not a digest", c.ImageRef)}
		}
		if dst.Repo() != ref.Repo() {
			opt := g.options()
			opt.CreateLayout = true
			if imgT, err = oci.Open(ctx, dst, opt); err != nil {
				return err
			}
			// A referrer lives in its subject's repository: push there too.
			dsts = []imageview.Dest{imgT, t}
		}
	}
	img, err := imageview.Build(ctx, t, ver, dsts, imageview.Options{
		Root: c.Root, LayerBytes: int64(c.LayerSize), OS: osName, Architecture: arch,
	})
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(root.Desc.Digest), err)
	}
	if dst.Tag != "" {
		if err := oci.TagBytes(ctx, imgT, img.Manifest, img.ManifestBytes, dst.Tag); err != nil {
			return fmt.Errorf("%s: %w", dst, err)
		}
	}
	out := exportedImage{
		Image:         pinnedImage(dst, img),
		Digest:        img.Manifest.Digest.String(),
		Attached:      ref.Pinned(img.Manifest.Digest),
		Volume:        ref.Pinned(root.Desc.Digest),
		VolumeBytes:   root.Bytes,
		BytesUploaded: img.BytesUploaded,
		Seconds:       time.Since(start).Seconds(),
		Layers:        []exportedLayer{},
	}
	for _, l := range img.Layers {
		out.ImageBytes += l.Desc.Size
		out.Layers = append(out.Layers, exportedLayer{Digest: l.Desc.Digest.String(), Size: l.Desc.Size, Files: l.Files, Bytes: l.Bytes, Uploaded: l.Uploaded})
	}
	out.ImageBytes += img.Config.Size + img.Manifest.Size
	if c.JSON {
		return json.NewEncoder(g.stdout).Encode(out)
	}
	uploaded := 0
	for _, l := range img.Layers {
		if l.Uploaded {
			uploaded++
		}
	}
	fmt.Fprintf(g.stderr, "bdnvol: image view of %s: %d layers, %s (volume %s), uploaded %d layers, %s, in %s\n",
		root.Desc.Digest, len(img.Layers), units.Bytes(out.ImageBytes), units.Bytes(root.Bytes),
		uploaded, units.Bytes(img.BytesUploaded), time.Since(start).Round(time.Millisecond))
	if out.Attached != out.Image {
		fmt.Fprintf(g.stderr, "bdnvol: attached to the version as %s\n", out.Attached)
	}
	fmt.Fprintln(g.stdout, out.Image)
	return nil
}

// pinnedImage is REPO[:TAG]@DIGEST of the pushed image.
func pinnedImage(dst oci.Ref, img *imageview.Image) string {
	s := dst.Repo()
	if dst.Tag != "" {
		s += ":" + dst.Tag
	}
	return s + "@" + img.Manifest.Digest.String()
}
