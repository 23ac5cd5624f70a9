package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"golang.org/x/term"

	"github.com/bdnvol/bdnvol/pkg/signature"
)

// SignCmd signs a version's digest with a cosign key.
type SignCmd struct {
	Ref  string `arg:"" help:"HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Key  string `required:"" type:"path" help:"Cosign private key file (encrypted; password from COSIGN_PASSWORD or a prompt)."`
	JSON bool   `name:"json" help:"Print one JSON object instead of text."`
}

// errNoPassword is returned when a key needs a password and none can be asked.
var errNoPassword = errors.New("COSIGN_PASSWORD is not set and stdin is not a terminal")

// keyPassword returns the password of cosign key files: COSIGN_PASSWORD
// when set (also empty), else a prompt on the terminal.
func keyPassword(g *Globals) func() ([]byte, error) {
	return func() ([]byte, error) {
		if p, ok := os.LookupEnv("COSIGN_PASSWORD"); ok {
			return []byte(p), nil
		}
		if !term.IsTerminal(int(os.Stdin.Fd())) {
			return nil, errNoPassword
		}
		fmt.Fprint(g.stderr, "Enter password for private key: ")
		p, err := term.ReadPassword(int(os.Stdin.Fd()))
		fmt.Fprintln(g.stderr)
		return p, err
	}
}

// Run signs the version.
func (c *SignCmd) Run(ctx context.Context, g *Globals) error {
	s, err := signature.LoadPrivateKey(c.Key, keyPassword(g))
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
		return json.NewEncoder(g.stdout).Encode(map[string]string{
			"reference": ref.Pinned(root.Desc.Digest), "digest": root.Desc.Digest.String(),
			"key": e.KeyID, "signature_tag": signature.Tag(root.Desc.Digest), "signature_manifest": e.Manifest.Digest.String(),
		})
	}
	fmt.Fprintf(g.stdout, "signed %s with key %s (%s)\n", ref.Pinned(root.Desc.Digest), e.KeyID, signature.Tag(root.Desc.Digest))
	return nil
}
