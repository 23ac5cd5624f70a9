package main

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/pkg/versions"
)

// ResolveCmd prints the digest-pinned form of a reference.
type ResolveCmd struct {
	Ref string `arg:"" help:"HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
}

// Run resolves the reference.
func (c *ResolveCmd) Run(ctx context.Context, g *Globals) error {
	ref, t, err := openRef(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	root, err := versions.Resolve(ctx, t, ref)
	if err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, ref.Pinned(root.Desc.Digest))
	return nil
}
