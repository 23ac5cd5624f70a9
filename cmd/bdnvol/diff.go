package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// DiffCmd compares two versions.
type DiffCmd struct {
	A       string `arg:"" name:"ref-a" help:"The old version."`
	B       string `arg:"" name:"ref-b" help:"The new version."`
	JSON    bool   `name:"json" help:"Print one JSON object instead of text."`
	Tensors bool   `name:"tensors" help:"Compare the tensors of safetensors files (dtype, shape, bytes), reading only headers and indexes."`
	Resolve bool   `name:"resolve" help:"With --tensors: fetch the chunks that small tensors share, so that none is left undecided."`
}

// Run compares the versions.
func (c *DiffCmd) Run(ctx context.Context, g *Globals) error {
	var sides [2]versions.Side
	for i, s := range []string{c.A, c.B} {
		ref, t, err := openRef(ctx, g, s)
		if err != nil {
			return err
		}
		root, err := versions.Resolve(ctx, t, ref)
		if err != nil {
			return err
		}
		sides[i] = versions.Side{Src: t, Desc: root.Desc}
	}
	if c.Tensors {
		return c.tensors(ctx, g, sides)
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
		fmt.Fprintf(w, "+ %s (%s)\n", termsafe.Name(f.Path), humanBytes(f.Size))
	}
	for _, f := range d.Removed {
		fmt.Fprintf(w, "- %s (%s)\n", termsafe.Name(f.Path), humanBytes(f.Size))
	}
	for _, f := range d.Changed {
		fmt.Fprintf(w, "~ %s (%s -> %s)\n", termsafe.Name(f.Path), humanBytes(f.OldSize), humanBytes(f.Size))
	}
	fmt.Fprintf(w, "files: %d added, %d removed, %d changed, %d unchanged\n", len(d.Added), len(d.Removed), len(d.Changed), d.Unchanged)
	fmt.Fprintf(w, "chunks: %d of %d shared (%s), %d new (%s); a push of B on top of A uploads %s\n",
		d.SharedChunks, d.ChunksB, humanBytes(d.SharedBytes), d.NewChunks, humanBytes(d.NewBytes), humanBytes(d.UploadBytes))
	return nil
}

// tensors prints the tensor-level comparison.
func (c *DiffCmd) tensors(ctx context.Context, g *Globals, sides [2]versions.Side) error {
	d, err := versions.CompareTensors(ctx, sides[0], sides[1], versions.TensorOptions{Resolve: c.Resolve})
	if err != nil {
		return err
	}
	if c.JSON {
		return json.NewEncoder(g.stdout).Encode(d)
	}
	w := g.stdout
	for _, t := range d.Added {
		fmt.Fprintf(w, "+ %s %s %s %v (%s)\n", termsafe.Name(t.File), termsafe.Name(t.Name), termsafe.Name(t.Dtype), t.Shape, humanBytes(t.Bytes))
	}
	for _, t := range d.Removed {
		fmt.Fprintf(w, "- %s %s %s %v (%s)\n", termsafe.Name(t.File), termsafe.Name(t.Name), termsafe.Name(t.Dtype), t.Shape, humanBytes(t.Bytes))
	}
	for _, t := range d.Changed {
		fmt.Fprintf(w, "~ %s %s: %s (%s %v -> %s %v, %s)\n", termsafe.Name(t.File), termsafe.Name(t.Name), strings.Join(t.What, ","),
			termsafe.Name(t.OldDtype), t.OldShape, termsafe.Name(t.Dtype), t.Shape, humanBytes(t.Bytes))
	}
	for _, t := range d.Undecided {
		fmt.Fprintf(w, "? %s %s: shares a changed chunk with other tensors; --resolve fetches it (%s)\n", termsafe.Name(t.File), termsafe.Name(t.Name), humanBytes(t.Bytes))
	}
	fmt.Fprintf(w, "tensors in %d safetensors files: %d added (%s), %d removed (%s), %d changed (%s), %d unchanged (%s)",
		len(d.Files), len(d.Added), humanBytes(d.AddedBytes), len(d.Removed), humanBytes(d.RemovedBytes),
		len(d.Changed), humanBytes(d.ChangedBytes), d.Unchanged, humanBytes(d.UnchangedBytes))
	if len(d.Undecided) > 0 {
		fmt.Fprintf(w, ", %d undecided (%s)", len(d.Undecided), humanBytes(d.UndecidedBytes))
	}
	fmt.Fprintln(w)
	return nil
}
