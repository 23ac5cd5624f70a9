package main

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// InspectCmd describes one version.
type InspectCmd struct {
	Ref  string   `arg:"" help:"HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	JSON bool     `name:"json" help:"Print one JSON object instead of text."`
	Key  []string `name:"key" type:"path" help:"Cosign public key file: check the version's signature with it (repeatable)."`
}

// Run inspects the version.
func (c *InspectCmd) Run(ctx context.Context, g *Globals) error {
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	d, err := versions.Inspect(ctx, t, root.Desc)
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	p, err := signature.LoadPolicy(c.Key...)
	if err != nil {
		return usageError{err}
	}
	sig := signature.StatusOf(ctx, t, root.Desc, true, p.Keys) // true: StatusOf looks the signature tag up
	views, err := imageview.List(ctx, t, d.Digest)
	if err != nil {
		fmt.Fprintf(g.stderr, "bdnvol: warning: %s: listing image views: %s\n", ref, termsafe.Text(err.Error()))
	}
	images := []string{}
	for _, v := range views {
		images = append(images, ref.Pinned(v.Digest))
	}
	if c.JSON {
		return versions.WriteJSON(g.stdout, struct {
			Reference string `json:"reference"`
			*versions.Details
			Signature signature.Status `json:"signature"`
			Images    []string         `json:"images"`
		}{ref.Pinned(d.Digest), d, sig, images}, d)
	}
	w := g.stdout
	fmt.Fprintf(w, "reference: %s\n", ref.Pinned(d.Digest))
	fmt.Fprintf(w, "digest:    %s\n", d.Digest)
	if d.Foreign != "" {
		fmt.Fprintf(w, "format:    %s (read-only)\n", foreignName(d.Foreign))
	} else {
		fmt.Fprintf(w, "format:    %d\n", d.FormatVersion)
	}
	if d.Sealed != nil {
		fmt.Fprintf(w, "sealed:    %s (%s)\n", d.Sealed.Format(time.RFC3339), termsafe.Name(d.SealedTag))
	}
	fmt.Fprintf(w, "tags:      %s\n", strings.Join(termsafe.Names(d.Tags), " "))
	fmt.Fprintf(w, "signed:    %s\n", sig)
	fmt.Fprintf(w, "files:     %d, %s\n", d.Files.Len(), units.Bytes(d.Bytes))
	fmt.Fprintf(w, "chunks:    %d, %s unique\n", d.Chunks, units.Bytes(d.UniqueBytes))
	if len(d.Deltas) > 0 {
		var plain int64
		for _, x := range d.Deltas {
			plain += x.Size
		}
		fmt.Fprintf(w, "deltas:    %d chunks (%s) stored as %s of deltas\n", len(d.Deltas), units.Bytes(plain), units.Bytes(d.DeltaBytes))
		for _, x := range d.Deltas {
			fmt.Fprintf(w, "  delta:   chunk %s (%s) as %s (%s), base %s\n", x.Chunk, units.Bytes(x.Size), x.Digest, units.Bytes(x.DeltaSize), x.Base)
		}
	}
	if d.Foreign != "" {
		fmt.Fprintf(w, "lazy:      %d of %d files read by range; streamed whole: %s\n", d.Files.Len()-countDirs(d)-len(d.Streamed), d.Files.Len()-countDirs(d), streamedList(d.Streamed))
	}
	for _, im := range images {
		fmt.Fprintf(w, "image:     %s\n", im)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODE\tSIZE\tSHA256\tPATH")
	n := 0
	for f := range d.Files.All() {
		if n++; n%4096 == 0 {
			tw.Flush() // a tabwriter holds its lines until flushed
		}
		path := termsafe.Name(f.Path)
		if f.Type == layout.TypeSymlink {
			path += " -> " + termsafe.Name(f.Target)
		}
		sum := f.SHA256
		if sum == "" {
			sum = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", modeString(f.Type, f.Mode), f.Size, sum, path)
	}
	return tw.Flush()
}

func modeString(typ string, mode uint32) string {
	m := fs.FileMode(mode & 0o777)
	switch typ {
	case layout.TypeDir:
		m |= fs.ModeDir
	case layout.TypeSymlink:
		m |= fs.ModeSymlink
	}
	return m.String()
}
