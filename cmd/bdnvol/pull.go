package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// PullCmd materialises a version on disk.
type PullCmd struct {
	Ref  string `arg:"" help:"Source: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Dir  string `arg:"" type:"path" help:"Directory to write into (created if missing)."`
	JSON bool   `name:"json" help:"Print one JSON object instead of text."`
	Jobs int    `default:"8" help:"Concurrent chunk fetches."`

	VerifyFiles bool `name:"verify-files" help:"Also check every written file's SHA-256 before it is renamed into place (reads each file once more; chunk digests are always checked)."`

	Cache       bool `xor:"cache" help:"Also store fetched chunks in the shared chunk cache (for mounts and later pulls). By default a pull uses chunks already in the cache but adds none: DIR holds every byte anyway."`
	NoCache     bool `name:"no-cache" xor:"cache" help:"Neither use nor fill the shared chunk cache."`
	CacheSize   Size `name:"cache-size" default:"10GiB" help:"Bound of the shared chunk cache with --cache."`
	MirrorFlags `embed:""`

	RequireSignature []string `name:"require-signature" type:"path" placeholder:"KEY" help:"Refuse the version unless it carries a valid signature by this cosign public key (repeatable: any one of them)."`
}

type pullOutput struct {
	Digest        string  `json:"digest"`
	Reference     string  `json:"reference"`
	Files         int     `json:"files"`
	Bytes         int64   `json:"bytes"`
	ChunksFetched int64   `json:"chunks_fetched"`
	BytesFetched  int64   `json:"bytes_fetched"`
	FilesReused   int     `json:"files_reused"`
	ChunksCopied  int64   `json:"chunks_copied"`
	BytesCopied   int64   `json:"bytes_copied"`
	FilesRemoved  int     `json:"files_removed"`
	CacheHits     int64   `json:"cache_hits"`
	MirrorHits    int64   `json:"mirror_hits"`
	Seconds       float64 `json:"seconds"`
}

// Run pulls the version.
func (c *PullCmd) Run(ctx context.Context, g *Globals) error {
	start := time.Now()
	ref, err := parseVersionRef(c.Ref)
	if err != nil {
		return err
	}
	if err := c.MirrorFlags.check(); err != nil {
		return err
	}
	policy, err := signature.LoadPolicy(c.RequireSignature...)
	if err != nil {
		return usageError{err}
	}
	t, err := oci.Open(ctx, ref, g.options())
	if err != nil {
		return err
	}
	desc, err := signature.Resolve(ctx, t, ref, policy)
	if err != nil {
		return err
	}
	src, mirrors, err := c.MirrorFlags.fetcher(g, ref, t)
	if err != nil {
		return err
	}
	var cache *chunkcache.Cache
	if !c.NoCache {
		// Without --cache nothing is added, so open with no bound: a
		// smaller one than the mounts' would evict their chunks.
		max := int64(math.MaxInt64)
		if c.Cache {
			max = int64(c.CacheSize)
		}
		if cache, err = chunkcache.Open(filepath.Join(g.cacheDir(), "chunks"), max); err != nil {
			return err
		}
		if c.Cache {
			src = cache.Fetcher(src)
		} else {
			src = cache.ReadOnly(src)
		}
	}
	v, err := layout.Open(ctx, src, desc)
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	counters := &layout.Counters{}
	stop := startProgress(g.stderr, "pull", counters)
	res, err := layout.Pull(ctx, src, v, c.Dir, layout.PullOptions{
		Jobs:        c.Jobs,
		Cache:       layout.OpenStatCache(g.cacheDir(), c.Dir, layout.Params{}),
		Counters:    counters,
		VerifyFiles: c.VerifyFiles,
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
		ChunksCopied:  res.ChunksCopied,
		BytesCopied:   res.BytesCopied,
		FilesRemoved:  res.FilesRemoved,
		Seconds:       time.Since(start).Seconds(),
	}
	if cache != nil {
		out.CacheHits = cache.Stats().Hits
	}
	if mirrors != nil {
		out.MirrorHits = mirrors.Stats().Hits
	}
	if c.JSON {
		return json.NewEncoder(g.stdout).Encode(out)
	}
	fmt.Fprintf(g.stderr, "pulled %d files, %s; fetched %d chunks, %s; copied %d chunks, %s, from files already there in %.1fs\n",
		out.Files, units.Bytes(out.Bytes), out.ChunksFetched, units.Bytes(out.BytesFetched), out.ChunksCopied, units.Bytes(out.BytesCopied), out.Seconds)
	fmt.Fprintln(g.stdout, out.Reference)
	return nil
}
