package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/retention"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/versions"
	"github.com/opencontainers/go-digest"
)

// VersionsCmd lists the sealed versions of a volume.
type VersionsCmd struct {
	Repo    string   `arg:"" help:"Volume: HOST/REPO or oci:PATH."`
	JSON    bool     `name:"json" help:"Print a JSON array instead of a table."`
	Deleted bool     `name:"deleted" help:"List the deleted versions that can still be restored instead."`
	Key     []string `name:"key" type:"path" help:"Cosign public key file: check each version's signature with it (repeatable)."`
}

// signedVersion is a version with its signature status, as versions prints it.
type signedVersion struct {
	versions.Version
	Signature signature.Status `json:"signature"`
}

// signedModel is a ModelPack model (read-only, not a sealed version) with
// its signature status, as versions prints it.
type signedModel struct {
	versions.Model
	Signature signature.Status `json:"signature"`
}

// Run lists the versions.
func (c *VersionsCmd) Run(ctx context.Context, g *Globals) error {
	ref, err := versions.ParseRepo(c.Repo, "versions")
	if err != nil {
		return usageError{err}
	}
	t, err := oci.Open(ctx, ref, g.options())
	if err != nil {
		return err
	}
	if c.Deleted {
		return listDeleted(ctx, g, t, c.JSON)
	}
	l, err := versions.ListAll(ctx, t)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Repo(), err)
	}
	for _, u := range l.Unreadable {
		fmt.Fprintf(g.stderr, "bdnvol: warning: %s: skipped %s\n", ref.Repo(), termsafe.Text(u.Err.Error()))
	}
	p, err := signature.LoadPolicy(c.Key...)
	if err != nil {
		return usageError{err}
	}
	sealed := map[digest.Digest]bool{}
	ds := make([]digest.Digest, len(l.Versions))
	for i, v := range l.Versions {
		ds[i] = v.Digest
		sealed[v.Digest] = true
	}
	models, err := versions.ListModels(ctx, t, sealed)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Repo(), err)
	}
	for _, m := range models {
		ds = append(ds, m.Digest)
	}
	sigs, err := signature.Statuses(ctx, t, ds, p)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Repo(), err)
	}
	vs := make([]signedVersion, len(l.Versions))
	for i, v := range l.Versions {
		vs[i] = signedVersion{v, sigs[i]}
	}
	ms := make([]signedModel, len(models))
	for i, m := range models {
		ms[i] = signedModel{m, sigs[len(vs)+i]}
	}
	if c.JSON {
		out := make([]any, 0, len(vs)+len(ms))
		for _, v := range vs {
			out = append(out, v)
		}
		for _, m := range ms {
			out = append(out, m)
		}
		return g.printJSON(out)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DIGEST\tSEALED\tBYTES\tFILES\tTAGS\tSIGNED")
	for _, v := range vs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", v.Digest, v.Sealed.Format(time.RFC3339), units.Bytes(v.Bytes), v.Files, strings.Join(termsafe.Names(v.Tags), ","), v.Signature)
	}
	if err := tw.Flush(); err != nil || len(ms) == 0 {
		return err
	}
	fmt.Fprintln(g.stdout, "\nmodels (read-only, by tag; not sealed versions: gc never deletes them)")
	tw = tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DIGEST\tFORMAT\tBYTES\tLAYERS\tTAGS\tSIGNED")
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", m.Digest, foreignName(m.Foreign), units.Bytes(m.Bytes), m.Layers, strings.Join(termsafe.Names(m.Tags), ","), m.Signature)
	}
	return tw.Flush()
}

// listDeleted lists the restorable deleted versions, oldest deletion first.
func listDeleted(ctx context.Context, g *Globals, t oci.Target, asJSON bool) error {
	all, err := retention.ListDeleted(ctx, t)
	if err != nil {
		return err
	}
	ds := retention.Restorable(all)
	if asJSON {
		return g.printJSON(ds)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DIGEST\tDELETED\tSEALED\tBYTES\tFILES\tFORMER TAGS")
	for _, d := range ds {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", d.Digest, d.Deleted.UTC().Format(time.RFC3339), d.Sealed.UTC().Format(time.RFC3339),
			units.Bytes(d.Bytes), d.Files, strings.Join(termsafe.Names(d.Tags), ","))
	}
	return tw.Flush()
}

// openVersion parses s, which must name a tag or a digest, opens its
// repository and resolves the version.
func openVersion(ctx context.Context, g *Globals, s string) (oci.Ref, oci.Target, *versions.Root, error) {
	ref, err := parseVersionRef(s)
	if err != nil {
		return ref, nil, nil, err
	}
	t, root, err := versions.Open(ctx, ref, g.options())
	return ref, t, root, err
}

// ResolveCmd prints the digest-pinned form of a reference.
type ResolveCmd struct {
	Ref string `arg:"" help:"HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
}

// Run resolves the reference.
func (c *ResolveCmd) Run(ctx context.Context, g *Globals) error {
	ref, _, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, ref.Pinned(root.Desc.Digest))
	return nil
}
