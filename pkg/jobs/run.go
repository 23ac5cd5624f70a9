package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/bdnvol/bdnvol/internal/proc"
)

// More sentinel errors, wrapped with the job ID.
var (
	// ErrCanceled is the cause of a job's context when its cancel was requested.
	ErrCanceled = errors.New("canceled")
	// ErrStopped is matched (errors.Is) by the error of a job whose work
	// was stopped by its context: a cancel request or a signal.
	ErrStopped = errors.New("jobs: stopped")
	// ErrWaitTimeout is wrapped when Wait gives up before the job ends.
	ErrWaitTimeout = errors.New("jobs: still running")
)

// Reasons recorded when a job is canceled.
const (
	ReasonCanceled    = "canceled by bdnvol jobs cancel"
	ReasonInterrupted = "interrupted by a signal"
)

// Result is what a job's work produced.
type Result struct {
	Reference     string
	Digest        string
	Commit        string
	BytesUploaded int64
	// Summary is logged by RunLogged once the job is recorded SUCCEEDED.
	Summary string
}

// Func is the work of a job: it gets the job as started and reports its
// progress through r.
type Func func(ctx context.Context, j *Job, r *Reporter) (Result, error)

// Reporter holds the progress of a running job.
type Reporter struct {
	mu       sync.Mutex
	progress Progress
	sample   func(*Progress)
}

// SetPhase records the phase the work is in, and the number of files when
// files > 0.
func (r *Reporter) SetPhase(phase string, files int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress.Phase = phase
	if files > 0 {
		r.progress.Files = files
	}
}

// Sample sets a function that fills in counters each time progress is recorded.
func (r *Reporter) Sample(f func(*Progress)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sample = f
}

// Progress returns the progress as it is now.
func (r *Reporter) Progress() Progress {
	r.mu.Lock()
	p, f := r.progress, r.sample
	r.mu.Unlock()
	if f != nil {
		f(&p)
	}
	return p
}

// stoppedError is the work's error, matching ErrStopped.
type stoppedError struct{ err error }

func (e stoppedError) Error() string        { return e.err.Error() }
func (e stoppedError) Unwrap() error        { return e.err }
func (e stoppedError) Is(target error) bool { return target == ErrStopped }

// ReportInterval is how often Run records a running job's progress and
// looks for a cancel request.
const ReportInterval = 500 * time.Millisecond

// Run runs job id in this process: it marks it RUNNING here, calls fn,
// records its progress every ReportInterval, cancels fn's context when a
// cancel is requested, and records how the job ended. It returns the
// job's final state (nil when the job could not be started) and fn's
// error; an error of work that was stopped matches ErrStopped.
func (s *Store) Run(ctx context.Context, id string, fn Func) (*Job, error) {
	pid := os.Getpid()
	j, err := s.Update(id, func(j *Job) error {
		if j.Done() || (j.State == Running && j.PID != pid) {
			return fmt.Errorf("job %s is %s", j.ID, j.State)
		}
		j.State, j.PID, j.PIDStart = Running, pid, proc.Start(pid)
		j.Attempts++
		j.Reason, j.CancelRequested, j.Progress = "", false, Progress{Phase: "listing"}
		j.Started, j.Finished = time.Now().UTC(), time.Time{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	id = j.ID

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := &Reporter{progress: j.Progress}
	report := func() {
		p := r.Progress()
		s.Update(id, func(j *Job) error {
			j.Progress = p
			if j.CancelRequested {
				cancel(ErrCanceled)
			}
			return nil
		})
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(ReportInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				report()
			}
		}
	})
	started := *j
	res, err := fn(ctx, &started, r)
	close(stop)
	wg.Wait()
	report()

	final, uerr := s.Update(id, func(j *Job) error {
		j.Finished = time.Now().UTC()
		j.PID, j.PIDStart = 0, ""
		switch {
		case err == nil:
			j.State, j.Reference, j.Digest, j.BytesUploaded = Succeeded, res.Reference, res.Digest, res.BytesUploaded
			j.Commit = res.Commit
		case errors.Is(context.Cause(ctx), ErrCanceled) || j.CancelRequested:
			j.State, j.Reason = Canceled, ReasonCanceled
		case ctx.Err() != nil:
			j.State, j.Reason = Canceled, ReasonInterrupted
		default:
			j.State, j.Reason = Failed, err.Error()
		}
		return nil
	})
	if final == nil {
		final = &started
	}
	if err != nil {
		if ctx.Err() != nil {
			return final, stoppedError{err}
		}
		return final, err
	}
	if uerr != nil {
		return final, fmt.Errorf("job %s: synced %s, but recording it failed: %w", id, res.Reference, uerr)
	}
	return final, nil
}

// Spawn starts cmd, the process that runs job id, in a new session with its
// output appended to the job's log, and records its PID. A job that could
// not be started is recorded FAILED.
func (s *Store) Spawn(id string, cmd *exec.Cmd) error {
	logf, err := os.OpenFile(s.LogPath(id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		s.Update(id, func(j *Job) error {
			j.State, j.Reason, j.Finished = Failed, "could not start: "+err.Error(), time.Now().UTC()
			return nil
		})
		return fmt.Errorf("start job %s: %w", id, err)
	}
	pid := cmd.Process.Pid
	_, err = s.Update(id, func(j *Job) error {
		if j.State == Queued {
			j.State, j.PID, j.PIDStart = Running, pid, proc.Start(pid)
		}
		return nil
	})
	cmd.Process.Release()
	return err
}

// Detach starts `exe jobs run ID` (exe "" for this executable), the
// process that runs job id, with Spawn.
func (s *Store) Detach(id, exe string) error {
	if exe == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("start job %s: %w", id, err)
		}
		exe = self
	}
	return s.Spawn(id, exec.Command(exe, "jobs", "run", id))
}

// Resume requeues job id (see Requeue) and detaches it (see Detach). It
// returns nil and the error when no job is id.
func (s *Store) Resume(id, exe string) (*Job, error) {
	j, err := s.Requeue(id)
	if err != nil {
		return j, err
	}
	return j, s.Detach(j.ID, exe)
}

// Requeue makes a FAILED or CANCELED job QUEUED again, to be run anew. It
// returns nil and the error when no job is id.
func (s *Store) Requeue(id string) (*Job, error) {
	return s.Update(id, func(j *Job) error {
		switch j.State {
		case Succeeded:
			return fmt.Errorf("job %s already succeeded: %s", j.ID, j.Reference)
		case Running, Queued:
			return fmt.Errorf("job %s is %s (pid %d)", j.ID, j.State, j.PID)
		}
		j.State, j.Reason, j.PID, j.PIDStart, j.CancelRequested = Queued, "", 0, "", false
		return nil
	})
}

// PollInterval is how often Wait and Cancel read a job's state.
const PollInterval = 200 * time.Millisecond

// Wait blocks until job id ends, ctx is done, or timeout (when > 0)
// passes; then it returns the job as last read with ctx's error or
// ErrWaitTimeout. It returns nil and the error when no job is id.
func (s *Store) Wait(ctx context.Context, id string, timeout time.Duration) (*Job, error) {
	j, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	var deadline <-chan time.Time
	if timeout > 0 {
		deadline = time.After(timeout)
	}
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for !j.Done() {
		select {
		case <-ctx.Done():
			return j, ctx.Err()
		case <-deadline:
			return j, fmt.Errorf("job %s after %v: %w", j.ID, timeout, ErrWaitTimeout)
		case <-tick.C:
		}
		next, err := s.Get(j.ID)
		if err != nil {
			return j, err
		}
		j = next
	}
	return j, nil
}

// CancelGrace is how long Cancel waits for a running job's process to stop.
const CancelGrace = 15 * time.Second

// Cancel cancels job id: a job nothing runs is CANCELED at once; the
// process of a running one is asked to stop (a cancel request and
// SIGTERM) and waited for up to CancelGrace. It returns nil and the error
// when no job is id.
func (s *Store) Cancel(ctx context.Context, id string) (*Job, error) {
	j, err := s.Update(id, func(j *Job) error {
		if j.Done() && j.State != Failed {
			return fmt.Errorf("job %s already %s", j.ID, j.State)
		}
		if j.State == Failed || !proc.Alive(j.PID, j.PIDStart) {
			// Nothing runs it: cancel it here.
			j.State, j.Reason, j.Finished, j.PID, j.PIDStart = Canceled, ReasonCanceled, time.Now().UTC(), 0, ""
			return nil
		}
		j.CancelRequested = true
		return nil
	})
	if err != nil {
		return j, err
	}
	if j.State != Running || j.PID == 0 {
		return j, nil
	}
	syscall.Kill(j.PID, syscall.SIGTERM)
	deadline := time.Now().Add(CancelGrace)
	for !j.Done() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return j, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		next, err := s.Get(j.ID)
		if err != nil {
			return j, err
		}
		j = next
	}
	if !j.Done() {
		return j, fmt.Errorf("job %s: asked process %d to stop; it has not yet", j.ID, j.PID)
	}
	return j, nil
}
