package main

import (
	"context"
	"fmt"
)

// ResolveCmd prints the digest-pinned form of a reference.
type ResolveCmd struct {
	Ref string `arg:"" help:"HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
}

// Run resolves the reference.
func (c *ResolveCmd) Run(ctx context.Context, g *Globals) error {
	ref, _, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, ref.Pinned(root.Desc.Digest))
	return nil
}
