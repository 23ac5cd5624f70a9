package main

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/ociarchive"
	"github.com/bdnvol/bdnvol/pkg/replicate"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// CopyCmd copies versions between registries and OCI layouts.
type CopyCmd struct {
	Refs      []string `arg:"" name:"SRC... DST" help:"Sources (HOST/REPO:TAG, HOST/REPO@DIGEST, oci:PATH[:TAG|@DIGEST], oci-archive:FILE.tar[:TAG|@DIGEST]), then the destination (HOST/REPO[:TAG], oci:PATH[:TAG] or oci-archive:FILE.tar[:TAG])."`
	Since     string   `help:"With an oci-archive: destination: leave out every blob of this version (HOST/REPO:TAG, @DIGEST, oci:…), which the receiving site holds."`
	AllTags   bool     `name:"all-tags" help:"Copy every tag of the source repository (protective tags, signatures and referrers indexes included)."`
	Referrers bool     `default:"true" negatable:"" help:"Also copy the manifests that refer to each version (signatures, image views)."`
	Tag       []string `help:"Extra tag to point at the copied version (repeatable; one source)."`
	JSON      bool     `name:"json" help:"Print one JSON object instead of text."`
	Jobs      int      `default:"8" help:"Concurrent blob checks and transfers."`
	MaxBlob   Size     `name:"max-blob-size" default:"64GiB" help:"Refuse a source whose manifests claim a blob larger than this, before sending anything."`
	MaxMfst   int      `name:"max-manifests" default:"25000" help:"Refuse a copy of more manifests than this (referrers included)."`
	RateFlags `embed:""`
}

// copyReport is the --json output of copy.
type copyReport struct {
	Reference string `json:"reference,omitempty"`
	replicate.Report
	ArchiveBytes int64   `json:"archive_bytes,omitempty"` // the oci-archive written
	Seconds      float64 `json:"seconds"`
}

// Run copies the versions.
func (c *CopyCmd) Run(ctx context.Context, g *Globals) error {
	start := time.Now()
	if len(c.Refs) < 2 {
		return usageError{fmt.Errorf("copy: want SRC... DST")}
	}
	srcs, dstArg := c.Refs[:len(c.Refs)-1], c.Refs[len(c.Refs)-1]
	dstRef, toArchive, err := parseSide(dstArg)
	if err != nil {
		return err
	}
	if c.Since != "" && !toArchive {
		return usageError{fmt.Errorf("copy --since: the destination must be an oci-archive:")}
	}
	archivePath := dstRef.Layout
	if dstRef.Digest != "" {
		return usageError{fmt.Errorf("copy: destination %s: a digest is the source's; give a repository or a tag", dstArg)}
	}
	if err := versions.CheckTags(c.Tag...); err != nil {
		return usageError{err}
	}
	if (len(srcs) > 1 || c.AllTags) && (dstRef.Tag != "" || len(c.Tag) > 0) {
		return usageError{fmt.Errorf("copy: destination %s: with several sources or --all-tags, each keeps its own tags", dstArg)}
	}
	c.RateFlags.apply(g)
	opt := g.options()
	opt.CreateLayout = true
	var dt oci.Target
	var archive *ociarchive.Writer
	if toArchive {
		// Written as the blobs arrive, renamed into place once whole.
		if archive, err = ociarchive.Create(archivePath); err != nil {
			return err
		}
		defer archive.Abort()
		dt = archive
	} else if dt, err = oci.Open(ctx, dstRef, opt); err != nil {
		return err
	}
	if c.Since != "" {
		have, err := sinceSet(ctx, g, c.Since)
		if err != nil {
			return err
		}
		dt = sinceTarget{Target: dt, have: have}
	}
	counters := &progress.Counters{}
	ropt := replicate.Options{Jobs: c.Jobs, Referrers: c.Referrers, Counters: counters, PartSize: opt.PartSize, Logf: g.logf,
		MaxBlobBytes: int64(c.MaxBlob), MaxManifests: c.MaxMfst}
	stop := startProgress(g.stderr, "copy", counters)
	defer stop()
	total := copyReport{Report: replicate.Report{Moved: []replicate.TagMove{}}}
	for _, s := range srcs {
		rep, err := c.copySource(ctx, g, s, replicate.Side{Ref: dstRef, Target: dt}, ropt)
		if err != nil {
			return fmt.Errorf("copy %s to %s: %w", s, dstArg, err)
		}
		total.Add(rep)
		if len(srcs) == 1 && rep.Digest != "" {
			total.Digest = rep.Digest
			total.Reference = dstRef.Pinned(rep.Digest)
		}
	}
	stop()
	if archive != nil {
		size, err := archive.Commit()
		if err != nil {
			return fmt.Errorf("copy: writing %s: %w", archivePath, err)
		}
		total.ArchiveBytes = size
		if total.Reference != "" {
			total.Reference = ociarchive.Prefix + archivePath + "@" + total.Digest.String()
		}
	}
	total.Seconds = time.Since(start).Seconds()
	// The tags it moved away from what the destination had, and those it
	// left as they were there, whatever the output format.
	for _, m := range total.Moved {
		g.logf("moved tag %s from %s to %s", m.Tag, m.From, m.To)
	}
	for _, k := range total.Kept {
		g.logf("left tag %s as the destination has it: %s", k.Tag, k.Reason)
	}
	if c.JSON {
		return g.printJSON(total)
	}
	fmt.Fprintf(g.stderr, "copied %d blobs, %s: sent %d (%s), mounted %d (%s), skipped %d (%s) already there; %d manifests sent, in %.1fs\n",
		total.Blobs, units.Bytes(total.Bytes), total.BlobsSent, units.Bytes(total.BytesSent), total.BlobsMounted, units.Bytes(total.BytesMounted),
		total.BlobsSkipped, units.Bytes(total.BytesSkipped), total.ManifestsSent, total.Seconds)
	if total.Reference != "" {
		fmt.Fprintln(g.stdout, total.Reference)
	}
	return nil
}

// parseSide parses a copy's source or destination: a registry or layout
// reference, or oci-archive:FILE[:TAG|@DIGEST] (archive true, Layout the file).
func parseSide(s string) (ref oci.Ref, archive bool, err error) {
	if ref, archive, err = archiveRef(s); err != nil || archive {
		return ref, archive, err
	}
	if ref, err = oci.ParseRef(s); err != nil {
		return ref, false, usageError{err}
	}
	return ref, false, nil
}

// copySource copies the version (or, with --all-tags or an archive named
// without a tag, every tag) that s names to dst.
func (c *CopyCmd) copySource(ctx context.Context, g *Globals, s string, dst replicate.Side, ropt replicate.Options) (*replicate.Report, error) {
	srcRef, fromArchive, err := parseSide(s)
	if err != nil {
		return nil, err
	}
	// An archive named without a tag or digest is imported whole.
	all := c.AllTags || fromArchive && srcRef.Reference() == ""
	if c.AllTags && srcRef.Reference() != "" {
		return nil, usageError{fmt.Errorf("copy --all-tags: source %s: give a repository without tag or digest", s)}
	}
	if !all && srcRef.Reference() == "" {
		return nil, usageError{fmt.Errorf("copy: source %s: no tag or digest (or use --all-tags)", s)}
	}
	if fromArchive {
		staged, cleanup, err := openArchive(ctx, srcRef)
		if err != nil {
			return nil, err
		}
		defer cleanup()
		srcRef = staged
	}
	sopt := g.options()
	if dst.Ref.Layout == "" {
		// Blobs stream from the source into the destination's paced
		// uploads, so pacing the source too would halve the rate: a copy
		// between registries moves --max-rate in each direction.
		sopt.Limiter = nil
	}
	st, err := oci.Open(ctx, srcRef, sopt)
	if err != nil {
		return nil, err
	}
	if len(c.Tag) > 0 {
		ropt.Tags = c.Tag
		if t := cmp.Or(dst.Ref.Tag, srcRef.Tag); t != "" {
			ropt.Tags = append([]string{t}, c.Tag...)
		}
	}
	src := replicate.Side{Ref: srcRef, Target: st}
	var rep *replicate.Report
	if all {
		rep, err = replicate.CopyAll(ctx, src, dst, ropt)
	} else {
		rep, err = replicate.Copy(ctx, src, dst, ropt)
	}
	return rep, missingHint(err, fromArchive)
}
