package main

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/pkg/jobs"
)

// SyncCmd seals a remote source as a new version, as a job.
type SyncCmd struct {
	Source   string   `arg:"" help:"hf://ORG/REPO[@REV], hf://datasets/ORG/REPO[@REV], s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, https://HOST/FILE, oci://HOST/REPO:TAG|@DIGEST (a ModelPack artifact or OCI image) or oci:PATH:TAG."`
	Ref      string   `arg:"" help:"Destination: HOST/REPO[:TAG] or oci:PATH[:TAG]."`
	Include  []string `help:"Sync only paths matching this glob (repeatable; * matches across /)."`
	Exclude  []string `help:"Skip paths matching this glob (repeatable)."`
	Endpoint string   `help:"S3 endpoint URL (default: AWS_ENDPOINT_URL, else AWS); uses path-style addressing."`
	List     bool     `help:"The https:// source is a list of URLs, one per line: URL [PATH] [sha256:HEX]."`
	Tag      []string `help:"Extra tag to point at the version (repeatable)."`

	AllowPrivateNetwork bool `help:"Let the source and its redirects reach loopback and private addresses (RFC 1918, ULA, CGNAT); by default only a configured endpoint (HF_ENDPOINT, --endpoint, STORAGE_EMULATOR_HOST) and addresses of its kind may be."`
	AllowLinkLocal      bool `help:"Let the source and its redirects reach link-local addresses and cloud metadata services (169.254.169.254)."`
	Jobs                int  `default:"8" help:"Concurrent uploads."`
	Detach              bool `help:"Run as a background job and print its ID at once; see bdnvol jobs wait."`
	JSON                bool `name:"json" help:"Print one JSON object instead of the reference."`
	RateFlags           `embed:""`
}

// Run creates the job and runs it here, or in a detached process.
func (c *SyncCmd) Run(ctx context.Context, g *Globals) error {
	spec := jobs.Spec{
		Source: c.Source, Destination: c.Ref, Include: c.Include, Exclude: c.Exclude,
		Endpoint: c.Endpoint, List: c.List, Tags: c.Tag, Jobs: c.Jobs, MaxRate: int64(c.MaxRate),
		AllowPrivateNetwork: c.AllowPrivateNetwork, AllowLinkLocal: c.AllowLinkLocal,
		PlainHTTP: g.PlainHTTP, InsecureSkipVerify: g.InsecureSkipVerify, CAFile: g.CAFile,
	}
	if err := jobs.CheckSync(ctx, spec, "bdnvol/"+version); err != nil {
		return usageError{err}
	}
	spec, err := jobs.Pin(ctx, spec, "bdnvol/"+version)
	if err != nil {
		return err
	}
	store, err := jobs.Open(jobs.DefaultDir())
	if err != nil {
		return err
	}
	j, err := store.Create(spec)
	if err != nil {
		return err
	}
	if c.Detach {
		if err := store.Detach(j.ID, ""); err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "bdnvol: started job %s; wait for it with: bdnvol jobs wait %s\n", j.ID, j.ID)
		fmt.Fprintln(g.stdout, j.ID)
		return nil
	}
	fmt.Fprintf(g.stderr, "bdnvol: job %s\n", j.ID)
	return runJob(ctx, g, store, j.ID, true, c.JSON)
}

// runJob runs job id in this process. In the foreground, log lines also go
// to stderr with a progress line, and the reference (or JSON) to stdout.
func runJob(ctx context.Context, g *Globals, store *jobs.Store, id string, foreground, asJSON bool) error {
	opt := jobs.SyncOptions{UserAgent: "bdnvol/" + version, Log: g.stderr, Foreground: foreground}
	if foreground {
		opt.Progress = func(c *progress.Counters) func() { return startProgress(g.stderr, "sync", c) }
	}
	out, err := store.RunSync(ctx, id, opt)
	if err != nil || !foreground {
		return err
	}
	if asJSON {
		return g.printJSON(out)
	}
	fmt.Fprintln(g.stdout, out.Reference)
	return nil
}
