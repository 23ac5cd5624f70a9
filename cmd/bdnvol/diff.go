package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// DiffCmd compares two versions.
type DiffCmd struct {
	A       string `arg:"" name:"ref-a" help:"The old version."`
	B       string `arg:"" name:"ref-b" help:"The new version."`
	JSON    bool   `name:"json" help:"Print one JSON object instead of text."`
	Tensors bool   `name:"tensors" help:"Compare the tensors of safetensors and GGUF files (dtype, shape, bytes), reading only headers (of up to 16 MiB; GGUF 64 MiB) and indexes."`
	Resolve bool   `name:"resolve" help:"With --tensors: fetch the chunks that small tensors share, so that none is left undecided."`
}

// Run compares the versions.
func (c *DiffCmd) Run(ctx context.Context, g *Globals) error {
	var sides [2]versions.Located
	for i, s := range []string{c.A, c.B} {
		_, t, root, err := openVersion(ctx, g, s)
		if err != nil {
			return err
		}
		sides[i] = versions.Located{Src: t, Desc: root.Desc}
	}
	if c.Tensors {
		return c.tensors(ctx, g, sides)
	}
	d, err := versions.Compare(ctx, sides[0], sides[1])
	if err != nil {
		return err
	}
	if c.JSON {
		return g.printJSON(d)
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

// tensors prints the tensor-level comparison.
func (c *DiffCmd) tensors(ctx context.Context, g *Globals, sides [2]versions.Located) error {
	d, err := versions.CompareTensors(ctx, sides[0], sides[1], versions.TensorOptions{Resolve: c.Resolve})
	if err != nil {
		return err
	}
	if c.JSON {
		return g.printJSON(d)
	}
	w := g.stdout
	for _, t := range d.Added {
		fmt.Fprintf(w, "+ %s %s %s %v (%s)\n", termsafe.Name(t.File), termsafe.Name(t.Name), termsafe.Name(t.Dtype), t.Shape, units.Bytes(t.Bytes))
	}
	for _, t := range d.Removed {
		fmt.Fprintf(w, "- %s %s %s %v (%s)\n", termsafe.Name(t.File), termsafe.Name(t.Name), termsafe.Name(t.Dtype), t.Shape, units.Bytes(t.Bytes))
	}
	for _, t := range d.Changed {
		fmt.Fprintf(w, "~ %s %s: %s (%s %v -> %s %v, %s)\n", termsafe.Name(t.File), termsafe.Name(t.Name), strings.Join(t.What, ","),
			termsafe.Name(t.OldDtype), t.OldShape, termsafe.Name(t.Dtype), t.Shape, units.Bytes(t.Bytes))
	}
	for _, t := range d.Undecided {
		fmt.Fprintf(w, "? %s %s: shares a changed chunk with other tensors; --resolve fetches it (%s)\n", termsafe.Name(t.File), termsafe.Name(t.Name), units.Bytes(t.Bytes))
	}
	fmt.Fprintf(w, "tensors in %d safetensors/GGUF files: %d added (%s), %d removed (%s), %d changed (%s), %d unchanged (%s)",
		len(d.Files), len(d.Added), units.Bytes(d.AddedBytes), len(d.Removed), units.Bytes(d.RemovedBytes),
		len(d.Changed), units.Bytes(d.ChangedBytes), d.Unchanged, units.Bytes(d.UnchangedBytes))
	if len(d.Undecided) > 0 {
		fmt.Fprintf(w, ", %d undecided (%s)", len(d.Undecided), units.Bytes(d.UndecidedBytes))
	}
	fmt.Fprintln(w)
	return nil
}
