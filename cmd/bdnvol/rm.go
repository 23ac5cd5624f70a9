package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/retention"
)

// RmCmd soft-deletes one version.
type RmCmd struct {
	Ref   string   `arg:"" help:"The version: HOST/REPO@DIGEST, HOST/REPO:TAG or oci:PATH[:TAG|@DIGEST]."`
	Refs  []string `name:"refs" help:"YAML/JSON file or directory whose volume references must not name it; - reads standard input; k8s://[CONTEXT] reads a live cluster (repeatable)."`
	Force bool     `help:"Delete it even if a reference source or a running mount names it."`
}

// Run deletes the version unless something references it.
func (c *RmCmd) Run(ctx context.Context, g *Globals) error {
	ref, err := parseVersionRef(c.Ref)
	if err != nil {
		return err
	}
	sources, err := newSources(ctx, g, ref, c.Refs)
	if err != nil {
		return err
	}
	rm, err := retention.Remove(ctx, ref, g.options(), retention.RemoveOptions{Sources: sources, Force: c.Force})
	if err != nil {
		return err
	}
	if rm.ViewsErr != nil {
		fmt.Fprintf(g.stderr, "bdnvol: warning: %s\n", termsafe.Text(rm.ViewsErr.Error()))
	} else if len(rm.Views) > 0 {
		fmt.Fprintf(g.stderr, "bdnvol: deleted %d image view(s) of %s\n", len(rm.Views), rm.Digest)
	}
	if len(rm.Tags) > 0 {
		fmt.Fprintf(g.stderr, "bdnvol: removed tags %s\n", strings.Join(termsafe.Names(rm.Tags), ", "))
	}
	fmt.Fprintf(g.stderr, "bdnvol: deleted %s (tombstone %s); bdnvol restore %s brings it back until a gc --purge after the restore window\n",
		rm.Digest, rm.Tombstone, rm.Pinned)
	fmt.Fprintln(g.stdout, rm.Pinned)
	return nil
}
