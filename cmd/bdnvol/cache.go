package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/bdnvol/bdnvol/internal/ratelimit"
	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// CacheCmd manages the node's chunk cache.
type CacheCmd struct {
	Warm CacheWarmCmd `cmd:"" help:"Fill the chunk cache with whole versions (or the files --prefetch names), verified; exits 0 only when complete."`
	Ls   CacheLsCmd   `cmd:"" help:"Show what the cache holds of each version it warmed or mounted."`
	Rm   CacheRmCmd   `cmd:"" help:"Drop a version's chunks from the cache (refused while a mount uses it)."`
	GC   CacheGCCmd   `cmd:"" name:"gc" help:"Drop every version no running mount uses."`
}

// cacheFlags are the flags every cache command takes.
type cacheFlags struct {
	CacheSize Size `name:"cache-size" default:"10GiB" help:"Bound of the chunk cache (as bdnvol mount's and the mounter's)."`
}

func (f cacheFlags) open(g *Globals) (*chunkcache.Cache, error) {
	return chunkcache.Open(filepath.Join(g.cacheDir(), "chunks"), int64(f.CacheSize))
}

// CacheWarmCmd is `bdnvol cache warm`.
type CacheWarmCmd struct {
	cacheFlags `embed:""`
	Refs       []string `arg:"" name:"ref" help:"Versions to warm (tags are resolved now)."`
	Prefetch   string   `default:"all" help:"Which files: all, or comma-separated globs (as bdnvol mount --prefetch)."`
	HostsDir   string   `name:"hosts-dir" placeholder:"DIR" help:"containerd-style hosts directory for registry mirrors (none to disable)."`
	Jobs       int      `default:"4" help:"Concurrent chunk fetches."`
	Bandwidth  Size     `default:"0" help:"Bytes per second to fetch at most (0: no bound)."`
	Profile    string   `default:"auto" placeholder:"auto|off|FILE" help:"Startup profile: its chunks are warmed first, in its order (auto: the node's stored profile of each version, else its referrer)."`
}

// Run warms the versions; a second run resumes where a stopped one was.
func (c *CacheWarmCmd) Run(ctx context.Context, g *Globals) error {
	if c.Prefetch == "headers" || c.Prefetch == "none" {
		return usageError{fmt.Errorf("--prefetch %s: cache warm takes all or globs", c.Prefetch)}
	}
	if err := profile.CheckMode(c.Profile); err != nil {
		return usageError{fmt.Errorf("--profile: %w", err)}
	}
	cache, err := c.open(g)
	if err != nil {
		return err
	}
	var done atomic.Int64
	start := time.Now()
	targets, err := warm.Warm(ctx, cache, c.Refs, warm.WarmOptions{
		Options: warm.Options{OCI: g.options(), Mirrors: oci.MirrorConfig{HostsDir: c.HostsDir, CAFile: g.CAFile, SkipVerify: g.InsecureSkipVerify},
			Profile: profile.Options{Mode: c.Profile, Store: profile.StoreIn(cache.Dir()), Logf: g.logf}},
		Patterns: c.Prefetch,
		Fill:     warm.FillOptions{Jobs: c.Jobs, Limiter: ratelimit.New(int64(c.Bandwidth)), Progress: func(n int64) { done.Add(n) }},
	})
	for _, t := range targets {
		cached, _ := warm.Cached(cache, t.Need)
		fmt.Fprintf(g.stdout, "%s\t%s of %s cached\n", termsafe.Name(t.Pinned), units.Bytes(cached), units.Bytes(t.Bytes()))
	}
	if err != nil {
		return err
	}
	g.logf("warmed %d version(s) in %s (%s fetched)", len(targets), time.Since(start).Round(time.Millisecond), units.Bytes(cache.Stats().FetchedBytes))
	return nil
}

// CacheLsCmd is `bdnvol cache ls`.
type CacheLsCmd struct {
	cacheFlags `embed:""`
	JSON       bool `name:"json" help:"Print JSON."`
}

// Run lists the recorded versions.
func (c *CacheLsCmd) Run(ctx context.Context, g *Globals) error {
	cache, err := c.open(g)
	if err != nil {
		return err
	}
	es, err := warm.List(cache)
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(es)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tREF\tCACHED\tTOTAL\tCOMPLETE\tIN USE")
	for _, e := range es {
		ref := e.Ref
		if e.Patterns != "" {
			ref += " (" + e.Patterns + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", termsafe.Name(e.Pinned), termsafe.Name(ref),
			units.Bytes(e.Cached), units.Bytes(e.Total), yesNo(e.Complete), yesNo(e.InUse))
	}
	return tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// CacheRmCmd is `bdnvol cache rm`.
type CacheRmCmd struct {
	cacheFlags `embed:""`
	Refs       []string `arg:"" name:"ref" help:"Versions to drop: a pinned reference, the reference as warmed, or a digest."`
}

// Run drops the versions.
func (c *CacheRmCmd) Run(ctx context.Context, g *Globals) error {
	cache, err := c.open(g)
	if err != nil {
		return err
	}
	for i, ref := range c.Refs {
		r, err := warm.Remove(cache, ref)
		if i == 0 {
			warnSkipped(g, r.Skipped)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(g.stdout, "removed %s: %d chunks, %s\n", strings.Join(termsafe.Names(r.Versions), ", "), r.Blobs, units.Bytes(r.Bytes))
	}
	return nil
}

// CacheGCCmd is `bdnvol cache gc`.
type CacheGCCmd struct {
	cacheFlags `embed:""`
}

// Run drops what no running mount uses.
func (c *CacheGCCmd) Run(ctx context.Context, g *Globals) error {
	cache, err := c.open(g)
	if err != nil {
		return err
	}
	r, err := warm.GC(cache)
	warnSkipped(g, r.Skipped)
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "removed %d version(s): %d chunks, %s\n", len(r.Versions), r.Blobs, units.Bytes(r.Bytes))
	return nil
}

// warnSkipped tells of the malformed version records rm and gc left alone.
func warnSkipped(g *Globals, skipped []error) {
	for _, err := range skipped {
		fmt.Fprintln(g.stderr, "bdnvol: warning: skipped", termsafe.Text(err.Error()))
	}
}
