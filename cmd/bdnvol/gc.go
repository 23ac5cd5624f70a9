package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/kuberefs"
	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/retention"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// GCCmd plans, and with --apply carries out, the deletion of old versions
// that nothing keeps.
type GCCmd struct {
	Repo          string             `arg:"" help:"Volume: HOST/REPO or oci:PATH."`
	KeepLast      int                `name:"keep-last" default:"3" help:"Keep the newest N versions."`
	KeepTag       []string           `name:"keep-tag" default:"*" help:"Keep versions with a human tag matching this glob (repeatable; default: any tag)."`
	KeepWithin    retention.Duration `name:"keep-within" default:"0s" help:"Keep versions pushed within this long (e.g. 7d, 36h)."`
	Refs          []string           `name:"refs" help:"YAML/JSON file or directory whose volume references keep versions; - reads standard input; k8s://[CONTEXT] reads a live cluster (repeatable)."`
	Apply         bool               `help:"Carry the plan out (default: only print it)."`
	JSON          bool               `name:"json" help:"Print the plan (and results) as JSON."`
	Purge         bool               `help:"Also delete for real the versions deleted more than --restore-window ago."`
	RestoreWindow retention.Duration `name:"restore-window" default:"7d" help:"How long a deleted version stays restorable before --purge removes it."`
	BlobGrace     retention.Duration `name:"blob-grace" default:"1h" help:"OCI layouts: leave unreachable blobs younger than this (a push may be running)."`
	DropWarmstate bool               `name:"drop-unused-warmstate" help:"Also delete the warm-state companions of kept versions whose keys no warm-state volume in --refs uses."`
}

// Run plans and applies.
func (c *GCCmd) Run(ctx context.Context, g *Globals) error {
	ref, err := versions.ParseRepo(c.Repo, "gc")
	if err != nil {
		return usageError{err}
	}
	policy := retention.Policy{
		KeepLast: c.KeepLast, KeepTags: c.KeepTag, KeepWithin: time.Duration(c.KeepWithin),
		Purge: c.Purge, RestoreWindow: time.Duration(c.RestoreWindow),
	}
	if err := policy.Validate(); err != nil {
		return usageError{err}
	}
	sources, err := newSources(ctx, g, ref, c.Refs)
	if err != nil {
		return err
	}
	rep, err := retention.GC(ctx, ref, g.options(), retention.GCOptions{
		Policy: policy, Sources: sources, Apply: c.Apply, BlobGrace: time.Duration(c.BlobGrace), DropUnusedCompanions: c.DropWarmstate,
		Planned: func(plan *retention.Plan) {
			if !c.JSON {
				printPlan(g.stdout, plan)
			}
			for _, w := range plan.Warnings {
				fmt.Fprintln(g.stderr, "bdnvol: warning:", termsafe.Text(w.String()))
			}
		},
		OnResult: func(r retention.Result) {
			switch {
			case r.Done && r.Action == retention.ActionDelete:
				fmt.Fprintf(g.stderr, "bdnvol: deleted %s (restorable: bdnvol restore %s)\n", r.Digest, ref.Pinned(r.Digest))
			case r.Done:
				fmt.Fprintf(g.stderr, "bdnvol: purged %s\n", r.Digest)
			case r.Skipped != "":
				fmt.Fprintf(g.stderr, "bdnvol: kept %s after all: %s\n", r.Digest, termsafe.Text(r.Skipped))
			}
		},
	})
	if rep == nil {
		return err
	}
	if !c.JSON {
		for _, d := range rep.Companions {
			state := "unused"
			switch {
			case d.Done:
				state = "deleted"
			case d.Error != "":
				state = "not deleted: " + termsafe.Text(d.Error)
			}
			fmt.Fprintf(g.stdout, "WARMSTATE %s of %s key %s: %s\n", d.Companion, d.Version, termsafe.Text(d.Key), state)
		}
	}
	if rep.Swept != nil {
		fmt.Fprintf(g.stderr, "bdnvol: removed %d unreachable blobs, %s\n", rep.Swept.Blobs, units.Bytes(rep.Swept.Bytes))
	}
	if c.JSON {
		if err := g.printJSON(rep); err != nil {
			return err
		}
	}
	return err
}

// printPlan writes the plan as a table: one line per version, then one per
// tombstone.
func printPlan(w io.Writer, p *retention.Plan) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tDIGEST\tSEALED\tTAGS\tWHY")
	for _, d := range p.Versions {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", strings.ToUpper(string(d.Action)), d.Digest,
			d.Sealed.UTC().Format(time.RFC3339), dash(strings.Join(termsafe.Names(d.Tags), ",")), termsafe.Text(d.Why()))
	}
	for _, d := range p.Deleted {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", strings.ToUpper(string(d.Action)), d.Digest,
			d.Sealed.UTC().Format(time.RFC3339), "(deleted "+d.Deleted.UTC().Format(time.RFC3339)+")", termsafe.Text(d.Why()))
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// mountReferences are the references that the bdnvol mounts ms serve.
func mountReferences(ms []mounts.Serving) []retention.Reference {
	var refs []retention.Reference
	for _, m := range ms {
		refs = append(refs, retention.Reference{Source: m.Mountpoint, Ref: m.Reference, Digest: m.Digest, Mount: true})
	}
	return refs
}

// newSources returns the reference sources of a command: the files and
// directories in paths, standard input for "-" (read once, now), the live
// clusters named k8s://[CONTEXT] (read at each call, in full or not at
// all), and the bdnvol mounts running on this machine.
func newSources(ctx context.Context, g *Globals, repo oci.Ref, paths []string) (retention.Sources, error) {
	var files []string
	var clusters []*kuberefs.Cluster
	for _, p := range paths {
		if !kuberefs.IsSource(p) {
			files = append(files, p)
			continue
		}
		c, err := kuberefs.Open(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("refs: %w", err)
		}
		clusters = append(clusters, c)
	}
	sources, err := retention.PathSources(repo, files, os.Stdin, func() []retention.Reference {
		return mountReferences(g.mountStore().Serving())
	})
	if errors.Is(err, retention.ErrStdinTwice) {
		return nil, usageError{fmt.Errorf("--refs -: %w", err)}
	}
	if err != nil || len(clusters) == 0 {
		return sources, err
	}
	return func(ctx context.Context) ([]retention.Reference, error) {
		refs, err := sources(ctx)
		if err != nil {
			return nil, err
		}
		for _, c := range clusters {
			err := c.Objects(ctx, func(name string, obj []byte) error {
				for _, r := range retention.Scan(repo, name, obj) {
					r.Source = name // one object, not a line of a file
					refs = append(refs, r)
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("refs: %w", err)
			}
		}
		return refs, nil
	}, nil
}
