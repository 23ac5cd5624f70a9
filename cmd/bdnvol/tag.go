package main

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// TagCmd points tags at an existing version: the rollback verb.
type TagCmd struct {
	Ref  string   `arg:"" help:"The version: HOST/REPO@DIGEST, HOST/REPO:TAG or oci:PATH[:TAG|@DIGEST]."`
	Tags []string `arg:"" help:"Tags to point at it."`
}

// Run moves the tags.
func (c *TagCmd) Run(ctx context.Context, g *Globals) error {
	if err := versions.CheckTags(c.Tags...); err != nil {
		return usageError{err}
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	if _, err := origin.Open(ctx, t, root.Desc); err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	moves, err := versions.Tag(ctx, t, root, c.Tags, versions.TagOptions{})
	if err != nil {
		return err
	}
	for _, tag := range c.Tags {
		if m, ok := moves[tag]; ok {
			from := "(new)"
			if m.Previous != "" {
				from = m.Previous.String()
			}
			fmt.Fprintf(g.stderr, "%s: %s -> %s\n", tag, from, m.Digest)
		} else {
			fmt.Fprintf(g.stderr, "%s: already at %s\n", tag, root.Desc.Digest)
		}
		fmt.Fprintln(g.stdout, tagged(ref, tag, root.Desc.Digest.String()))
	}
	return nil
}

// tagged formats REPO:TAG@DIGEST.
func tagged(ref oci.Ref, tag, d string) string {
	return ref.Repo() + ":" + tag + "@" + d
}
