package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/jobs"
)

// JobsCmd lists and manages sync jobs.
type JobsCmd struct {
	List   JobsListCmd   `cmd:"" default:"withargs" help:"List jobs, newest first (the default)."`
	Wait   JobsWaitCmd   `cmd:"" help:"Wait for a job to end; print its version reference on success."`
	Cancel JobsCancelCmd `cmd:"" help:"Cancel a job."`
	Logs   JobsLogsCmd   `cmd:"" help:"Print a job's log."`
	Resume JobsResumeCmd `cmd:"" help:"Run a failed, interrupted or canceled job again in the background; nothing already uploaded is uploaded again."`
	Run    JobsRunCmd    `cmd:"" hidden:"" help:"Run a job in this process (used by detached jobs)."`
}

func openJobs() (*jobs.Store, error) { return jobs.Open(jobs.DefaultDir()) }

// JobsListCmd lists jobs.
type JobsListCmd struct {
	JSON bool `name:"json" help:"Print a JSON array."`
}

// Run lists the jobs.
func (c *JobsListCmd) Run(g *Globals) error {
	store, err := openJobs()
	if err != nil {
		return err
	}
	js, err := store.List()
	if err != nil {
		return err
	}
	if c.JSON {
		out := make([]jobs.Summary, 0, len(js))
		for _, j := range js {
			out = append(out, j.Summary())
		}
		return g.printJSON(out)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSOURCE\tDESTINATION\tSTATE\tPROGRESS")
	for _, j := range js {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", j.ID, termsafe.Name(j.Spec.Source), termsafe.Name(j.Spec.Destination), j.StateText(), j.ProgressText())
	}
	return tw.Flush()
}

// JobsWaitCmd waits for a job.
type JobsWaitCmd struct {
	ID      string        `arg:"" help:"Job ID (or a unique prefix)."`
	Timeout time.Duration `help:"Give up waiting after this long (0: wait as long as it takes)."`
}

// Run blocks until the job ends; Ctrl+C stops the waiting, not the job.
func (c *JobsWaitCmd) Run(ctx context.Context, g *Globals) error {
	store, err := openJobs()
	if err != nil {
		return err
	}
	return waitJob(ctx, g, store, c.ID, c.Timeout)
}

func waitJob(ctx context.Context, g *Globals, store *jobs.Store, id string, timeout time.Duration) error {
	j, err := store.WaitSucceeded(ctx, id, timeout)
	if j == nil {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, j.Reference)
	return nil
}

// JobsCancelCmd cancels a job.
type JobsCancelCmd struct {
	ID string `arg:"" help:"Job ID (or a unique prefix)."`
}

// Run asks the job's process to stop and waits (a while) until it has.
func (c *JobsCancelCmd) Run(ctx context.Context, g *Globals) error {
	store, err := openJobs()
	if err != nil {
		return err
	}
	j, err := store.Cancel(ctx, c.ID)
	if j == nil {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stderr, "bdnvol: job %s: %s\n", j.ID, j.State)
	return nil
}

// JobsLogsCmd prints a job's log.
type JobsLogsCmd struct {
	ID     string `arg:"" help:"Job ID (or a unique prefix)."`
	Follow bool   `short:"f" help:"Keep printing until the job ends."`
}

// Run copies the log to stdout.
func (c *JobsLogsCmd) Run(ctx context.Context, g *Globals) error {
	store, err := openJobs()
	if err != nil {
		return err
	}
	err = store.CopyLog(ctx, c.ID, g.stdout, c.Follow)
	if errors.Is(err, jobs.ErrNotFound) || errors.Is(err, jobs.ErrAmbiguous) {
		return usageError{err}
	}
	return err
}

// JobsResumeCmd runs a job again.
type JobsResumeCmd struct {
	ID   string `arg:"" help:"Job ID (or a unique prefix)."`
	Wait bool   `help:"Wait for it to end, as bdnvol jobs wait does."`
}

// Run requeues the job and starts a detached process for it.
func (c *JobsResumeCmd) Run(ctx context.Context, g *Globals) error {
	store, err := openJobs()
	if err != nil {
		return err
	}
	j, err := store.Resume(c.ID, "")
	if j == nil {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stderr, "bdnvol: resumed job %s; wait for it with: bdnvol jobs wait %s\n", j.ID, j.ID)
	if c.Wait {
		return waitJob(ctx, g, store, j.ID, 0)
	}
	fmt.Fprintln(g.stdout, j.ID)
	return nil
}

// JobsRunCmd runs a job in this process.
type JobsRunCmd struct {
	ID string `arg:""`
}

// Run runs the job; its log lines go to stderr (the job's log file).
func (c *JobsRunCmd) Run(ctx context.Context, g *Globals) error {
	store, err := openJobs()
	if err != nil {
		return err
	}
	return runJob(ctx, g, store, c.ID, false, false)
}
