package main

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/retention"
)

// RestoreCmd brings a soft-deleted version back.
type RestoreCmd struct {
	Ref    string `arg:"" help:"The deleted version: HOST/REPO@DIGEST or oci:PATH@DIGEST (or HOST/REPO DIGEST)."`
	Digest string `arg:"" optional:"" help:"The digest, when REF names only the repository."`
}

// Run restores the version with a new protective tag and no human tags.
func (c *RestoreCmd) Run(ctx context.Context, g *Globals) error {
	ref, err := retention.ParseRestoreRef(c.Ref, c.Digest)
	if err != nil {
		return usageError{err}
	}
	tag, warn, err := retention.RestoreRef(ctx, ref, g.options())
	if err != nil {
		return err
	}
	if warn != nil {
		fmt.Fprintln(g.stderr, "bdnvol: warning:", termsafe.Text(fmt.Sprint(warn)))
	}
	fmt.Fprintf(g.stderr, "bdnvol: restored %s as %s, without its former tags\n", ref.Digest, tag)
	fmt.Fprintln(g.stdout, ref.Pinned(ref.Digest))
	return nil
}
