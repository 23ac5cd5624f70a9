package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// VerifyCmd checks a directory against a version.
type VerifyCmd struct {
	Ref  string `arg:"" help:"The version: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Dir  string `arg:"" optional:"" type:"path" help:"Directory to compare with the version: every file's size, mode and SHA-256, symlink targets, extra and missing entries."`
	JSON bool   `name:"json" help:"Print one JSON object instead of text."`
}

// errDiffers is returned (exit 1) when the directory differs from the version.
var errDiffers = errors.New("differs from the version")

type verifyOutput struct {
	Digest      string              `json:"digest"`
	Reference   string              `json:"reference"`
	Dir         string              `json:"dir"`
	OK          bool                `json:"ok"`
	Differences []layout.Difference `json:"differences"`
}

// Run compares the directory with the version.
func (c *VerifyCmd) Run(ctx context.Context, g *Globals) error {
	if c.Dir == "" {
		return usageError{fmt.Errorf("verify %s: name a directory to check against the version", c.Ref)}
	}
	ref, err := parseVersionRef(c.Ref)
	if err != nil {
		return err
	}
	t, err := oci.Open(ctx, ref, g.options())
	if err != nil {
		return err
	}
	desc, err := oci.Resolve(ctx, t, ref)
	if err != nil {
		return err
	}
	v, err := layout.Open(ctx, t, desc)
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	diffs, err := layout.VerifyDir(ctx, v, c.Dir)
	if err != nil {
		return fmt.Errorf("verify %s against %s: %w", c.Dir, ref.Pinned(desc.Digest), err)
	}
	out := verifyOutput{Digest: desc.Digest.String(), Reference: ref.Pinned(desc.Digest), Dir: c.Dir, OK: len(diffs) == 0, Differences: diffs}
	if out.Differences == nil {
		out.Differences = []layout.Difference{}
	}
	if c.JSON {
		if err := json.NewEncoder(g.stdout).Encode(out); err != nil {
			return err
		}
	} else {
		for _, d := range diffs {
			fmt.Fprintln(g.stdout, termsafe.Text(d.String()))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%s: %w %s: %d differences", c.Dir, errDiffers, out.Reference, len(diffs))
	}
	if !c.JSON {
		fmt.Fprintf(g.stderr, "%s matches %s\n", c.Dir, out.Reference)
	}
	return nil
}
