package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// HistoryCmd lists where a tag pointed and when.
type HistoryCmd struct {
	Ref  string `arg:"" help:"HOST/REPO:TAG or oci:PATH:TAG."`
	JSON bool   `name:"json" help:"Print one JSON object instead of a table."`
}

// Run prints the history.
func (c *HistoryCmd) Run(ctx context.Context, g *Globals) error {
	ref, err := oci.ParseRef(c.Ref)
	if err != nil {
		return usageError{err}
	}
	if ref.Tag == "" || ref.Digest != "" {
		return usageError{fmt.Errorf("%s: history takes REPO:TAG", c.Ref)}
	}
	t, err := oci.Open(ctx, ref, g.options())
	if err != nil {
		return err
	}
	out, err := versions.ReadTagHistory(ctx, t, ref)
	if err != nil {
		return err
	}
	if c.JSON {
		return g.printJSON(out)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tOP\tDIGEST\tPREVIOUS")
	for _, m := range out.Moves {
		prev := "-"
		if m.Previous != "" {
			prev = termsafe.Name(m.Previous.String())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Time.UTC().Format(time.RFC3339), termsafe.Name(m.Op), termsafe.Name(m.Digest.String()), prev)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case out.Current == "":
		fmt.Fprintf(g.stderr, "%s no longer exists\n", termsafe.Name(ref.Tag))
	case out.MovedOutside():
		fmt.Fprintf(g.stderr, "%s points at %s now: it was moved without bdnvol, so that move is not recorded\n", termsafe.Name(ref.Tag), termsafe.Name(out.Current.String()))
	}
	return nil
}
