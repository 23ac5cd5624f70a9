package main

import (
	"context"
	"fmt"
	"time"

	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
)

// ExportModelPackCmd writes the ModelPack view of a version.
type ExportModelPackCmd struct {
	Ref  string `arg:"" help:"The version: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Dst  string `arg:"" optional:"" name:"dst" help:"Where to push the view: HOST/REPO[:TAG] or oci:PATH[:TAG] (default: the volume's repository, untagged)."`
	JSON bool   `name:"json" help:"Print one JSON object instead of text."`
}

// Run builds and pushes the view.
func (c *ExportModelPackCmd) Run(ctx context.Context, g *Globals) error {
	start := time.Now()
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	dst, err := parseImageDestination(c.Dst)
	if err != nil {
		return usageError{err}
	}
	out, err := modelpack.Export(ctx, t, ref, root.Desc, dst, g.options())
	if err != nil {
		return err
	}
	if c.JSON {
		return g.printJSON(out)
	}
	fmt.Fprintf(g.stderr, "bdnvol: ModelPack view of %s: %d layers, %s (%d layers, %s shared with the version), uploaded %s, in %s\n",
		out.Volume, out.Layers, units.Bytes(out.Bytes), out.SharedLayers, units.Bytes(out.SharedBytes),
		units.Bytes(out.BytesUploaded), time.Since(start).Round(time.Millisecond))
	for _, s := range out.Skipped {
		fmt.Fprintf(g.stderr, "bdnvol: left out %s (a ModelPack view holds regular files only)\n", s)
	}
	if out.Attached != out.Image {
		fmt.Fprintf(g.stderr, "bdnvol: attached to the version as %s\n", out.Attached)
	}
	fmt.Fprintln(g.stdout, out.Image)
	return nil
}
