package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/jobs"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/source"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// SyncCmd seals a remote source as a new version, as a job.
type SyncCmd struct {
	Source   string   `arg:"" help:"hf://ORG/REPO[@REV], hf://datasets/ORG/REPO[@REV], s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or https://HOST/FILE."`
	Ref      string   `arg:"" help:"Destination: HOST/REPO[:TAG] or oci:PATH[:TAG]."`
	Include  []string `help:"Sync only paths matching this glob (repeatable; * matches across /)."`
	Exclude  []string `help:"Skip paths matching this glob (repeatable)."`
	Endpoint string   `help:"S3 endpoint URL (default: AWS_ENDPOINT_URL, else AWS); uses path-style addressing."`
	List     bool     `help:"The https:// source is a list of URLs, one per line: URL [PATH] [sha256:HEX]."`
	Tag      []string `help:"Extra tag to point at the version (repeatable)."`
	Jobs     int      `default:"8" help:"Concurrent uploads."`
	Detach   bool     `help:"Run as a background job and print its ID at once; see bdnvol jobs wait."`
	JSON     bool     `name:"json" help:"Print one JSON object instead of the reference."`
}

// syncOutput is what a finished sync reports.
type syncOutput struct {
	Job    string `json:"job"`
	Source string `json:"source"`
	Commit string `json:"commit,omitempty"`
	versions.Report
}

// Run creates the job and runs it here, or in a detached process.
func (c *SyncCmd) Run(ctx context.Context, g *Globals) error {
	spec := jobs.Spec{
		Source: c.Source, Destination: c.Ref, Include: c.Include, Exclude: c.Exclude,
		Endpoint: c.Endpoint, List: c.List, Tags: c.Tag, Jobs: c.Jobs,
		PlainHTTP: g.PlainHTTP, InsecureSkipVerify: g.InsecureSkipVerify, CAFile: g.CAFile,
	}
	if err := checkSpec(ctx, spec); err != nil {
		return usageError{err}
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
		if err := startDetached(store, j.ID); err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "bdnvol: started job %s; wait for it with: bdnvol jobs wait %s\n", j.ID, j.ID)
		fmt.Fprintln(g.stdout, j.ID)
		return nil
	}
	fmt.Fprintf(g.stderr, "bdnvol: job %s\n", j.ID)
	return runJob(ctx, g, store, j.ID, true, c.JSON)
}

// checkSpec refuses a bad source or destination before a job is created.
func checkSpec(ctx context.Context, spec jobs.Spec) error {
	return versions.CheckSync(ctx, spec.Source, spec.Destination, spec.Tags, sourceOptions(spec))
}

func sourceOptions(spec jobs.Spec) source.Options {
	return source.Options{Include: spec.Include, Exclude: spec.Exclude, Endpoint: spec.Endpoint, List: spec.List,
		UserAgent: "bdnvol/" + version}
}

// startDetached runs `bdnvol jobs run ID` in a new session, its output
// going to the job's log.
func startDetached(store *jobs.Store, id string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	return store.Spawn(id, exec.Command(exe, "jobs", "run", id))
}

// runJob runs job id in this process. In the foreground, log lines also go
// to stderr with a progress line, and the reference (or JSON) to stdout.
func runJob(ctx context.Context, g *Globals, store *jobs.Store, id string, foreground, asJSON bool) error {
	start := time.Now()
	var out *syncOutput
	_, err := store.RunLogged(ctx, id, g.stderr, foreground, func(ctx context.Context, j *jobs.Job, r *jobs.Reporter, logf jobs.Logf) (jobs.Result, error) {
		counters := &layout.Counters{}
		r.Sample(func(p *jobs.Progress) {
			p.Total, p.Processed, p.Sent = counters.Total.Load(), counters.Processed.Load(), counters.Sent.Load()
		})
		stopBar := func() {}
		if foreground {
			stopBar = startProgress(g.stderr, "sync", counters)
		}
		var err error
		out, err = syncVersion(ctx, j, counters, r.SetPhase, logf)
		stopBar()
		if err != nil {
			return jobs.Result{}, err
		}
		out.Job, out.Seconds = j.ID, time.Since(start).Seconds()
		return jobs.Result{Reference: out.Reference, Digest: out.Digest, Commit: out.Commit, BytesUploaded: out.BytesUploaded,
			Summary: fmt.Sprintf("sealed %d files, %s in %d chunks; uploaded %d chunks, %s in %.1fs; %s",
				out.Files, units.Bytes(out.Bytes), out.Chunks, out.ChunksUploaded, units.Bytes(out.BytesUploaded), out.Seconds, out.Reference)}, nil
	})
	if err != nil || !foreground {
		return err
	}
	if asJSON {
		return json.NewEncoder(g.stdout).Encode(out)
	}
	fmt.Fprintln(g.stdout, out.Reference)
	return nil
}

// syncVersion runs the sync of job j, logging what it does.
func syncVersion(ctx context.Context, j *jobs.Job, counters *layout.Counters, setPhase func(string, int), logf jobs.Logf) (*syncOutput, error) {
	spec := j.Spec
	ref, err := oci.ParseRef(spec.Destination)
	if err != nil {
		return nil, err
	}
	g := &Globals{PlainHTTP: spec.PlainHTTP, InsecureSkipVerify: spec.InsecureSkipVerify, CAFile: spec.CAFile}
	name := spec.Source // as the source names itself, once it is open
	res, err := versions.Sync(ctx, spec.Source, ref, versions.SyncOptions{
		Source: sourceOptions(spec), OCI: g.options(), Tags: spec.Tags, Jobs: spec.Jobs, Counters: counters,
		OnListing: func(src string) { name = src; logf("listing %s", src) },
		OnListed: func(files int, bytes int64, rev string) {
			if rev != "" {
				logf("%s is at commit %s", name, rev)
			}
			logf("%d files, %s to transfer", files, units.Bytes(bytes))
			setPhase("transferring", files)
		},
		OnVerified: func() { setPhase("tagging", 0) },
	})
	if err != nil {
		return nil, err
	}
	return &syncOutput{Source: spec.Source, Commit: res.Revision, Report: res.Report(ref)}, nil
}
