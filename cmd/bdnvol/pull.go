package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// PullCmd materialises a version on disk.
type PullCmd struct {
	Ref  string `arg:"" help:"Source: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Dir  string `arg:"" type:"path" help:"Directory to write into (created if missing)."`
	JSON bool   `name:"json" help:"Print one JSON object instead of text."`
	Jobs int    `default:"8" help:"Concurrent chunk fetches."`
}

type pullOutput struct {
	Digest        string  `json:"digest"`
	Reference     string  `json:"reference"`
	Files         int     `json:"files"`
	Bytes         int64   `json:"bytes"`
	ChunksFetched int64   `json:"chunks_fetched"`
	BytesFetched  int64   `json:"bytes_fetched"`
	FilesReused   int     `json:"files_reused"`
	Seconds       float64 `json:"seconds"`
}

// Run pulls the version.
func (c *PullCmd) Run(ctx context.Context, g *Globals) error {
	start := time.Now()
	ref, err := oci.ParseRef(c.Ref)
	if err != nil {
		return usageError{err}
	}
	if ref.Reference() == "" {
		return usageError{fmt.Errorf("%s: name a tag or a digest", c.Ref)}
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
	counters := &layout.Counters{}
	stop := startProgress(g.stderr, "pull", counters)
	res, err := layout.Pull(ctx, t, v, c.Dir, layout.PullOptions{
		Jobs:     c.Jobs,
		Cache:    layout.OpenStatCache(g.cacheDir(), c.Dir, layout.Params{}),
		Counters: counters,
	})
	stop()
	if err != nil {
		return fmt.Errorf("pull %s: %w", ref.Pinned(desc.Digest), err)
	}
	out := pullOutput{
		Digest:        desc.Digest.String(),
		Reference:     ref.Pinned(desc.Digest),
		Files:         res.Files,
		Bytes:         res.Bytes,
		ChunksFetched: res.ChunksFetched,
		BytesFetched:  res.BytesFetched,
		FilesReused:   res.FilesReused,
		Seconds:       time.Since(start).Seconds(),
	}
	if c.JSON {
		return json.NewEncoder(g.stdout).Encode(out)
	}
	fmt.Fprintf(g.stderr, "pulled %d files, %s; fetched %d chunks, %s in %.1fs\n",
		out.Files, humanBytes(out.Bytes), out.ChunksFetched, humanBytes(out.BytesFetched), out.Seconds)
	fmt.Fprintln(g.stdout, out.Reference)
	return nil
}
