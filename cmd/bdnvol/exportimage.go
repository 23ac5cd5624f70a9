package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
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

// Run builds and pushes the image.
func (c *ExportImageCmd) Run(ctx context.Context, g *Globals) error {
	start := time.Now()
	osName, arch, err := parsePlatform(c.Platform)
	if err != nil {
		return usageError{err}
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	dst, err := parseImageDestination(c.ImageRef)
	if err != nil {
		return usageError{err}
	}
	out, err := imageview.Export(ctx, t, ref, root.Desc, root.Bytes, dst, g.options(), imageview.Options{
		Root: c.Root, LayerBytes: int64(c.LayerSize), OS: osName, Architecture: arch, Foreign: origin.Formats,
	})
	if err != nil {
		return err
	}
	if c.JSON {
		return g.printJSON(out)
	}
	fmt.Fprintf(g.stderr, "bdnvol: image view of %s: %d layers, %s (volume %s), uploaded %d layers, %s, in %s\n",
		out.VolumeDigest, len(out.Layers), units.Bytes(out.ImageBytes), units.Bytes(out.VolumeBytes),
		out.LayersUploaded, units.Bytes(out.BytesUploaded), time.Since(start).Round(time.Millisecond))
	if out.Attached != out.Image {
		fmt.Fprintf(g.stderr, "bdnvol: attached to the version as %s\n", out.Attached)
	}
	fmt.Fprintln(g.stdout, out.Image)
	return nil
}

// errPlatform is wrapped when --platform is not OS/ARCH.
var errPlatform = errors.New("want OS/ARCH")

// parsePlatform splits a --platform value, OS/ARCH.
func parsePlatform(s string) (osName, arch string, err error) {
	osName, arch, ok := strings.Cut(s, "/")
	if !ok || osName == "" || arch == "" || strings.Contains(arch, "/") {
		return "", "", fmt.Errorf("--platform %q: %w", s, errPlatform)
	}
	return osName, arch, nil
}

// parseImageDestination parses where the image view goes: HOST/REPO[:TAG]
// or oci:PATH[:TAG], never a digest; "" is the zero Ref (the volume's
// repository, untagged).
func parseImageDestination(s string) (oci.Ref, error) {
	if s == "" {
		return oci.Ref{}, nil
	}
	dst, err := oci.ParseRef(s)
	if err != nil {
		return dst, err
	}
	if dst.Digest != "" {
		return dst, fmt.Errorf("%s: %w", s, imageview.ErrDestinationDigest)
	}
	return dst, nil
}
