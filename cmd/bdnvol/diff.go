package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// DiffCmd compares two versions.
type DiffCmd struct {
	A    string `arg:"" name:"ref-a" help:"The old version."`
	B    string `arg:"" name:"ref-b" help:"The new version."`
	JSON bool   `name:"json" help:"Print one JSON object instead of text."`
}

// Run compares the versions.
func (c *DiffCmd) Run(ctx context.Context, g *Globals) error {
	var sides [2]versions.Side
	for i, s := range []string{c.A, c.B} {
		_, t, root, err := openVersion(ctx, g, s)
		if err != nil {
			return err
		}
		sides[i] = versions.Side{Src: t, Desc: root.Desc}
	}
	d, err := versions.Compare(ctx, sides[0], sides[1])
	if err != nil {
		return err
	}
	if c.JSON {
		return json.NewEncoder(g.stdout).Encode(d)
	}
	w := g.stdout
	for _, f := range d.Added {
		fmt.Fprintf(w, "+ %s (%s)\n", termsafe.Name(f.Path), units.Bytes(f.Size))
	}
	for _, f := range d.Removed {
		fmt.Fprintf(w, "- %s (%s)\n", termsafe.Name(f.Path), units.Bytes(f.Size))
	}
	for _, f := range d.Changed {
		fmt.Fprintf(w, "~ %s (%s -> %s)\n", termsafe.Name(f.Path), units.Bytes(f.OldSize), units.Bytes(f.Size))
	}
	fmt.Fprintf(w, "files: %d added, %d removed, %d changed, %d unchanged\n", len(d.Added), len(d.Removed), len(d.Changed), d.Unchanged)
	fmt.Fprintf(w, "chunks: %d of %d shared (%s), %d new (%s); a push of B on top of A uploads %s\n",
		d.SharedChunks, d.ChunksB, units.Bytes(d.SharedBytes), d.NewChunks, units.Bytes(d.NewBytes), units.Bytes(d.UploadBytes))
	return nil
}
