package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/retention"
)

// RmCmd soft-deletes one version.
type RmCmd struct {
	Ref   string   `arg:"" help:"The version: HOST/REPO@DIGEST, HOST/REPO:TAG or oci:PATH[:TAG|@DIGEST]."`
	Refs  []string `name:"refs" help:"YAML/JSON file or directory whose volume references must not name it; - reads standard input (repeatable)."`
	Force bool     `help:"Delete it even if a reference source or a running mount names it."`
}

// Run deletes the version unless something references it.
func (c *RmCmd) Run(ctx context.Context, g *Globals) error {
	ref, err := parseVersionRef(c.Ref)
	if err != nil {
		return err
	}
	sources, err := newSources(g, ref, c.Refs)
	if err != nil {
		return err
	}
	unlock, err := oci.LockLayout(ref)
	if err != nil {
		return err
	}
	defer unlock()
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	d := root.Desc.Digest
	rec, err := retention.SoftDelete(ctx, t, d, retention.DeleteOptions{
		Check: func(ctx context.Context, tags []string) error {
			if c.Force {
				return nil
			}
			refs, err := sources(ctx)
			if err != nil {
				return err
			}
			var why []string
			for _, r := range retention.KeepReasons(retention.Version{Digest: d, Tags: tags}, refs, retention.Policy{}) {
				why = append(why, r.Text)
			}
			if len(why) > 0 {
				return fmt.Errorf("%s is still needed: %s; new replicas would fail to start without it (--force deletes it anyway)",
					ref.Pinned(d), strings.Join(why, "; "))
			}
			return nil
		},
	})
	if errors.Is(err, retention.ErrNotLive) {
		return fmt.Errorf("%s: %w", ref.Pinned(d), err)
	}
	if err != nil {
		return err
	}
	if views, err := retention.DeleteImageViews(ctx, t, d); err != nil {
		fmt.Fprintf(g.stderr, "bdnvol: warning: %v\n", err)
	} else if len(views) > 0 {
		fmt.Fprintf(g.stderr, "bdnvol: deleted %d image view(s) of %s\n", len(views), d)
	}
	if len(rec.Tags) > 0 {
		fmt.Fprintf(g.stderr, "bdnvol: removed tags %s\n", strings.Join(termsafe.Names(rec.Tags), ", "))
	}
	fmt.Fprintf(g.stderr, "bdnvol: deleted %s (tombstone %s); bdnvol restore %s brings it back until a gc --purge after the restore window\n",
		d, rec.Tag, ref.Pinned(d))
	fmt.Fprintln(g.stdout, ref.Pinned(d))
	return nil
}
