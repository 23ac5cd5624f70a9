package jobs

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/ratelimit"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/source"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// SyncReport is what a finished sync job reports.
type SyncReport struct {
	Job    string `json:"job"`
	Source string `json:"source"`
	Commit string `json:"commit,omitempty"`
	// FilesUnchanged counts the files the store identified as for the
	// previous version: their chunk lists were reused, their bytes not read.
	FilesUnchanged int `json:"files_unchanged"`
	versions.PublishReport
}

// SourceOptions are the options of spec's source; userAgent names the
// client in its requests.
func (spec Spec) SourceOptions(userAgent string) source.Options {
	return source.Options{Include: spec.Include, Exclude: spec.Exclude, Endpoint: spec.Endpoint, List: spec.List,
		UserAgent: userAgent, AllowPrivateNetwork: spec.AllowPrivateNetwork, AllowLinkLocal: spec.AllowLinkLocal,
		OCI: oci.Options{PlainHTTP: spec.PlainHTTP, InsecureSkipVerify: spec.InsecureSkipVerify, CAFile: spec.CAFile}}
}

// Pin pins spec's source to what it names now (an oci:// tag resolved to
// its manifest digest, see source.Pin), for a job that imports the same
// thing each time it runs.
func Pin(ctx context.Context, spec Spec, userAgent string) (Spec, error) {
	src, err := source.Pin(ctx, spec.Source, spec.SourceOptions(userAgent))
	if err != nil {
		return spec, err
	}
	spec.Source = src
	return spec, nil
}

// CheckSync refuses a bad source or destination of spec before a job is
// created for it.
func CheckSync(ctx context.Context, spec Spec, userAgent string) error {
	return versions.CheckSync(ctx, spec.Source, spec.Destination, spec.Tags, spec.SourceOptions(userAgent))
}

// SyncOptions configure RunSync.
type SyncOptions struct {
	UserAgent string // names the client in its requests
	// Log and Foreground are as RunLogged takes them.
	Log        io.Writer
	Foreground bool
	// Progress (if set) is started with the counters of the work and
	// stopped when it ends.
	Progress func(*progress.Counters) func()
}

// RunSync runs sync job id in this process (see RunLogged): the job's
// source sealed as a version of its destination, checked and tagged, each
// step logged and its progress recorded.
func (s *Store) RunSync(ctx context.Context, id string, opt SyncOptions) (*SyncReport, error) {
	start := time.Now()
	var out *SyncReport
	_, err := s.RunLogged(ctx, id, opt.Log, opt.Foreground, func(ctx context.Context, j *Job, r *Reporter, logf Logf) (Result, error) {
		counters := &progress.Counters{}
		r.Sample(func(p *Progress) {
			p.Total, p.Processed, p.Sent = counters.Total.Load(), counters.Processed.Load(), counters.Sent.Load()
		})
		stop := func() {}
		if opt.Progress != nil {
			stop = opt.Progress(counters)
		}
		var err error
		out, err = syncVersion(ctx, j, counters, r.SetPhase, logf, opt.UserAgent)
		stop()
		if err != nil {
			return Result{}, err
		}
		out.Job, out.Seconds = j.ID, time.Since(start).Seconds()
		return Result{Reference: out.Reference, Digest: out.Digest, Commit: out.Commit, BytesUploaded: out.BytesUploaded,
			Summary: fmt.Sprintf("sealed %d files, %s in %d chunks; uploaded %d chunks, %s in %.1fs; %s",
				out.Files, units.Bytes(out.Bytes), out.Chunks, out.ChunksUploaded, units.Bytes(out.BytesUploaded), out.Seconds, out.Reference)}, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// syncVersion runs the sync of job j, logging what it does.
func syncVersion(ctx context.Context, j *Job, counters *progress.Counters, setPhase func(string, int), logf Logf, userAgent string) (*SyncReport, error) {
	spec := j.Spec
	ref, err := oci.ParseRef(spec.Destination)
	if err != nil {
		return nil, err
	}
	name := spec.Source                // as the source names itself, once it is open
	lim := ratelimit.New(spec.MaxRate) // one bound for the source and the destination
	sopt := spec.SourceOptions(userAgent)
	sopt.Limiter = lim
	res, err := versions.Sync(ctx, spec.Source, ref, versions.SyncOptions{
		Source: sopt,
		OCI: oci.Options{PlainHTTP: spec.PlainHTTP, InsecureSkipVerify: spec.InsecureSkipVerify, CAFile: spec.CAFile,
			UserAgent: userAgent, Limiter: lim},
		Tags: spec.Tags, Jobs: spec.Jobs, Counters: counters,
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
	if res.Unchanged > 0 {
		logf("%d files unchanged at the source since the previous version: not read", res.Unchanged)
	}
	return &SyncReport{Source: spec.Source, Commit: res.Revision, FilesUnchanged: res.Unchanged, PublishReport: res.Report(ref)}, nil
}
