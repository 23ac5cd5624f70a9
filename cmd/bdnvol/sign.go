package main

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/pkg/signature"
)

// SignCmd signs a version's digest with a cosign key.
type SignCmd struct {
	Ref  string `arg:"" help:"HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Key  string `required:"" type:"path" help:"Cosign private key file (encrypted; password from COSIGN_PASSWORD or a prompt)."`
	JSON bool   `name:"json" help:"Print one JSON object instead of text."`
}

// Run signs the version.
func (c *SignCmd) Run(ctx context.Context, g *Globals) error {
	s, err := signature.LoadPrivateKey(c.Key, signature.Password(g.stderr))
	if err != nil {
		return usageError{err}
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	e, err := signature.Sign(ctx, t, signature.RepoName(ref), root.Desc, s)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(root.Desc.Digest), err)
	}
	if c.JSON {
		return g.printJSON(e.SignedJSON(ref.Pinned(root.Desc.Digest), root.Desc.Digest))
	}
	where := signature.Tag(root.Desc.Digest)
	if e.ReferrerManifest.Digest != "" {
		where += ", and referrer " + e.ReferrerManifest.Digest.String()
	}
	fmt.Fprintf(g.stdout, "signed %s with key %s (%s)\n", ref.Pinned(root.Desc.Digest), e.KeyID, where)
	return nil
}
