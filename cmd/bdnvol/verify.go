package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/bdnvol/bdnvol/pkg/signature"
)

// VerifyCmd checks a version: its signature by one of the --key public keys.
type VerifyCmd struct {
	Ref  string   `arg:"" help:"HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Dir  string   `arg:"" optional:"" type:"path" help:"Directory to check against the version."`
	Key  []string `name:"key" type:"path" help:"Cosign public key file; the version must carry a valid signature by one of them (repeatable)."`
	JSON bool     `name:"json" help:"Print one JSON object instead of text."`
}

// Run verifies the version.
func (c *VerifyCmd) Run(ctx context.Context, g *Globals) error {
	if len(c.Key) == 0 && c.Dir == "" {
		return usageError{errors.New("verify: give --key KEY (signature check) or a directory (content check)")}
	}
	if len(c.Key) == 0 {
		return usageError{fmt.Errorf("verify %s: checking directory %s needs the directory check; give --key KEY to check the signature", c.Ref, c.Dir)}
	}
	return c.verifySignature(ctx, g)
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
		return json.NewEncoder(g.stdout).Encode(map[string]any{
			"reference": ref.Pinned(v.Digest), "digest": v.Digest.String(), "key": v.KeyID,
			"referrer": v.Entry.Referrer, "signature_manifest": v.Entry.Manifest.Digest.String(),
		})
	}
	fmt.Fprintf(g.stdout, "verified %s: signed by key %s\n", ref.Pinned(v.Digest), v.KeyID)
	return nil
}
