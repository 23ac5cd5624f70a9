package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// VerifyCmd checks a version's signature, a directory against a version, or both.
type VerifyCmd struct {
	Ref  string   `arg:"" help:"The version: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Dir  string   `arg:"" optional:"" type:"path" help:"Directory to compare with the version: every file's size, mode and SHA-256, symlink targets, extra and missing entries."`
	Key  []string `name:"key" type:"path" help:"Cosign public key file; the version must carry a valid signature by one of them (repeatable)."`
	JSON bool     `name:"json" help:"Print JSON instead of text (one object per check)."`

	// The selection of a partial pull: only it is compared.
	SelectFlags `embed:""`
}

// errDiffers is returned (exit 1) when the directory differs from the version.
var errDiffers = errors.New("differs from the version")

// Run checks the signature (with --key), then the directory (with DIR).
func (c *VerifyCmd) Run(ctx context.Context, g *Globals) error {
	if len(c.Key) == 0 && c.Dir == "" {
		return usageError{fmt.Errorf("verify %s: give --key KEY (signature check), a directory (content check), or both", c.Ref)}
	}
	if c.Dir == "" && len(c.Include)+len(c.Exclude) > 0 {
		return usageError{fmt.Errorf("verify %s: --include/--exclude select what to compare in a directory; give one", c.Ref)}
	}
	if len(c.Key) > 0 {
		if err := c.verifySignature(ctx, g); err != nil {
			return err
		}
	}
	if c.Dir != "" {
		return c.verifyDir(ctx, g)
	}
	return nil
}

func (c *VerifyCmd) verifySignature(ctx context.Context, g *Globals) error {
	p, err := signature.LoadPolicy(c.Key...)
	if err != nil {
		return usageError{err}
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	v, err := signature.Verify(ctx, t, root.Desc, p.Keys)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(root.Desc.Digest), err)
	}
	if c.JSON {
		return g.printJSON(v.JSON(ref.Pinned(v.Digest)))
	}
	fmt.Fprintf(g.stdout, "verified %s: signed by key %s\n", ref.Pinned(v.Digest), v.KeyID)
	return nil
}

func (c *VerifyCmd) verifyDir(ctx context.Context, g *Globals) error {
	sel, err := c.SelectFlags.match()
	if err != nil {
		return err
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	out, err := versions.VerifyDir(ctx, t, ref, root, c.Dir, sel)
	if err != nil {
		return err
	}
	if c.JSON {
		if err := g.printJSON(out); err != nil {
			return err
		}
	} else {
		for _, d := range out.Differences {
			fmt.Fprintln(g.stdout, termsafe.Text(d.String()))
		}
	}
	if !out.OK {
		return fmt.Errorf("%s: %w %s: %d differences", c.Dir, errDiffers, out.Reference, len(out.Differences))
	}
	if !c.JSON {
		fmt.Fprintf(g.stderr, "%s matches %s\n", c.Dir, out.Reference)
	}
	return nil
}
