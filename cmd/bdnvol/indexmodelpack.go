package main

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// IndexModelPackCmd publishes a ModelPack model's derived index, signed.
type IndexModelPackCmd struct {
	Ref  string `arg:"" help:"The model: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Key  string `required:"" type:"path" help:"Cosign private key file that signs the index (encrypted; password from COSIGN_PASSWORD or a prompt)."`
	JSON bool   `name:"json" help:"Print one JSON object instead of text."`
}

// Run derives the index (reading every layer once, verified), pushes it as
// a referrer of the model and signs it.
func (c *IndexModelPackCmd) Run(ctx context.Context, g *Globals) error {
	s, err := signature.LoadPrivateKey(c.Key, signature.Password(g.stderr))
	if err != nil {
		return usageError{err}
	}
	ref, err := parseVersionRef(c.Ref)
	if err != nil {
		return usageError{err}
	}
	t, err := oci.Open(ctx, ref, g.options())
	if err != nil {
		return err
	}
	desc, err := signature.Resolve(ctx, t, ref, signature.Policy{})
	if err != nil {
		return err
	}
	a, err := modelpack.Fetch(ctx, t, desc)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(desc.Digest), err)
	}
	if !modelpack.IsModel(a.Manifest) {
		return fmt.Errorf("%s: %w", ref.Pinned(desc.Digest), modelpack.ErrNotModel)
	}
	idx, err := modelpack.PublishIndex(ctx, t, desc)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(desc.Digest), err)
	}
	e, err := signature.Sign(ctx, t, signature.RepoName(ref), idx, s)
	if err != nil {
		return fmt.Errorf("%s: index %s: %w", ref.Pinned(desc.Digest), idx.Digest, err)
	}
	if c.JSON {
		return g.printJSON(map[string]string{"model": ref.Pinned(desc.Digest), "index": ref.Pinned(idx.Digest), "key": e.KeyID})
	}
	fmt.Fprintf(g.stderr, "bdnvol: index of %s published and signed with key %s\n", ref.Pinned(desc.Digest), e.KeyID)
	fmt.Fprintln(g.stdout, ref.Pinned(idx.Digest))
	return nil
}
