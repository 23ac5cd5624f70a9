package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/statcache"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// PushCmd seals a directory and pushes it.
type PushCmd struct {
	Ref       string   `arg:"" help:"Destination: HOST/REPO[:TAG] or oci:PATH[:TAG]."`
	Dir       string   `arg:"" optional:"" default:"." type:"path" help:"Directory to seal (default: current directory)."`
	Tag       []string `help:"Extra tag to point at the version (repeatable)."`
	JSON      bool     `name:"json" help:"Print one JSON object instead of text."`
	Jobs      int      `default:"8" help:"Concurrent uploads."`
	ChunkMin  Size     `name:"chunk-min" help:"Minimum chunk size (default: the volume's, else 1MiB)."`
	ChunkAvg  Size     `name:"chunk-avg" help:"Average chunk size (default: the volume's, else 8MiB)."`
	ChunkMax  Size     `name:"chunk-max" help:"Maximum chunk size (default: the volume's, else 16MiB)."`
	MaxLayers int      `name:"max-layers" hidden:"" help:"Layers per manifest before splitting into parts."`
	Delta     string   `name:"delta" enum:"off,auto" default:"auto" help:"Store chunks that changed a little as deltas against the base version (auto), or every chunk whole (off)."`
	Base      string   `name:"base" help:"Base version of the deltas: a tag or digest of the repository (default: the version TAG points at, else the newest sealed one)."`
	BaseDir   string   `name:"base-dir" type:"existingdir" help:"A local copy of the base version: bases are read from it where they verify instead of downloaded (default: the directory this node last pushed to the repository, when that push was the base version)."`
	RateFlags `embed:""`
}

// lastPushedDir returns the directory this node last pushed to repo when
// that push sealed base and the directory is another than dir (a tree
// overwritten in place holds the new version, not the base); else nil.
func lastPushedDir(cacheDir, repo, dir string, base digest.Digest) push.Source {
	l, ok := statcache.LoadLastPush(cacheDir, repo)
	if !ok || l.Digest != base {
		return nil
	}
	if abs, err := filepath.Abs(dir); err == nil && abs == l.Dir {
		return nil
	}
	if st, err := os.Stat(l.Dir); err != nil || !st.IsDir() {
		return nil
	}
	return push.DirSource(l.Dir)
}

// Run pushes the directory.
func (c *PushCmd) Run(ctx context.Context, g *Globals) error {
	start := time.Now()
	ref, err := versions.ParsePushRef(c.Ref, c.Tag)
	if err != nil {
		return usageError{err}
	}
	c.RateFlags.apply(g)
	opt := g.options()
	opt.CreateLayout = true
	t, err := oci.Open(ctx, ref, opt)
	if err != nil {
		return err
	}
	params, err := versions.PushParams(ctx, t, ref.Tag, layout.Params{Min: int64(c.ChunkMin), Avg: int64(c.ChunkAvg), Max: int64(c.ChunkMax)})
	if err != nil {
		return usageError{err}
	}
	var baseDir push.Source
	if c.BaseDir != "" {
		if c.Delta != "auto" {
			return usageError{fmt.Errorf("--base-dir needs --delta auto")}
		}
		baseDir = push.DirSource(c.BaseDir)
	}
	counters := &progress.Counters{}
	stop := startProgress(g.stderr, "push", counters)
	cacheDir := g.cacheDir()
	res, err := versions.Publish(ctx, t, push.DirSource(c.Dir), versions.PublishOptions{
		Tag:       ref.Tag,
		Extra:     c.Tag,
		Delta:     c.Delta == "auto",
		Base:      c.Base,
		LocalBase: func(d digest.Digest) push.Source { return lastPushedDir(cacheDir, ref.Repo(), c.Dir, d) },
		Push: push.Options{
			Params:       params,
			MaxLayers:    c.MaxLayers,
			Jobs:         c.Jobs,
			Cache:        statcache.Open(g.cacheDir(), c.Dir, params),
			Counters:     counters,
			Destination:  ref.Repo(),
			DeltaBaseDir: baseDir,
		},
	})
	stop()
	if err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	if err := statcache.SaveLastPush(cacheDir, ref.Repo(), c.Dir, res.Root.Digest); err != nil {
		fmt.Fprintf(g.stderr, "bdnvol: warning: recording the push for the next one's deltas: %v\n", err)
	}
	out := res.Report(ref)
	out.Seconds = time.Since(start).Seconds()
	if c.JSON {
		return g.printJSON(out)
	}
	fmt.Fprintf(g.stderr, "sealed %d files, %s in %d chunks; uploaded %d chunks, %s in %.1fs\n",
		out.Files, units.Bytes(out.Bytes), out.Chunks, out.ChunksUploaded, units.Bytes(out.BytesUploaded), out.Seconds)
	if out.DeltaChunks > 0 {
		fmt.Fprintf(g.stderr, "%d chunks (%s) stored as deltas of %s (%.3f); bases: %s read locally, %s downloaded\n",
			out.DeltaChunks, units.Bytes(out.DeltaChunkBytes), units.Bytes(out.BytesAsDeltas), out.DeltaRatio, units.Bytes(out.BaseBytesLocal), units.Bytes(out.BaseBytesFetched))
	}
	fmt.Fprintln(g.stdout, out.Reference)
	return nil
}
