package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/units"
)

// Logf writes one line of a job's log.
type Logf func(format string, args ...any)

// LoggedFunc is the work of a job run by RunLogged: a Func that also logs.
type LoggedFunc func(ctx context.Context, j *Job, r *Reporter, logf Logf) (Result, error)

// RunLogged runs job id as Run does, writing its log to w: each line
// stamped with the time (UTC) and made safe for a terminal. In the
// foreground (w is not the job's log file) the lines also go to the job's
// log file. The error of a job that failed or was stopped says how to
// resume it; a job that succeeded logs its Result's Summary.
func (s *Store) RunLogged(ctx context.Context, id string, w io.Writer, foreground bool, fn LoggedFunc) (*Job, error) {
	logf := func(format string, args ...any) {
		fmt.Fprintf(w, "%s %s\n", time.Now().UTC().Format(time.RFC3339), termsafe.Text(fmt.Sprintf(format, args...)))
	}
	var logFile *os.File
	defer func() {
		if logFile != nil {
			logFile.Close()
		}
	}()
	var res Result
	var workErr error
	j, err := s.Run(ctx, id, func(ctx context.Context, j *Job, r *Reporter) (Result, error) {
		if foreground {
			if f, err := os.OpenFile(s.LogPath(j.ID), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
				logFile, w = f, io.MultiWriter(w, f)
			}
		}
		logf("job %s attempt %d: sync %s to %s", j.ID, j.Attempts, j.Spec.Source, j.Spec.Destination)
		res, workErr = fn(ctx, j, r, logf)
		return res, workErr
	})
	if j == nil {
		return nil, err
	}
	if workErr != nil {
		logf("job %s: %v", id, err)
		if errors.Is(err, ErrStopped) {
			return j, fmt.Errorf("job %s stopped: %w; resume it with: bdnvol jobs resume %s", id, err, id)
		}
		return j, fmt.Errorf("job %s failed: %w; after fixing the cause, resume it with: bdnvol jobs resume %s", id, err, id)
	}
	if err != nil {
		return j, err
	}
	if res.Summary != "" {
		logf("job %s: %s", j.ID, res.Summary)
	}
	return j, nil
}

// Summary is a job as `bdnvol jobs --json` shows it.
type Summary struct {
	ID            string    `json:"id"`
	Source        string    `json:"source"`
	Destination   string    `json:"destination"`
	State         State     `json:"state"`
	Reason        string    `json:"reason,omitempty"`
	Progress      Progress  `json:"progress"`
	PID           int       `json:"pid,omitempty"`
	Attempts      int       `json:"attempts"`
	Reference     string    `json:"reference,omitempty"`
	Commit        string    `json:"commit,omitempty"`
	BytesUploaded int64     `json:"bytes_uploaded,omitempty"`
	Created       time.Time `json:"created"`
	Updated       time.Time `json:"updated"`
}

// Summary returns the job as `bdnvol jobs --json` shows it.
func (j *Job) Summary() Summary {
	return Summary{ID: j.ID, Source: j.Spec.Source, Destination: j.Spec.Destination, State: j.State, Reason: j.Reason,
		Progress: j.Progress, PID: j.PID, Attempts: j.Attempts, Reference: j.Reference, Commit: j.Commit,
		BytesUploaded: j.BytesUploaded, Created: j.Created, Updated: j.Updated}
}

// ProgressText is a job's progress in a few words, for people.
func (j *Job) ProgressText() string {
	p := j.Progress
	switch {
	case j.State == Succeeded:
		return fmt.Sprintf("100%%, %s uploaded", units.Bytes(j.BytesUploaded))
	case p.Total > 0:
		return fmt.Sprintf("%.0f%% of %s, %s uploaded", 100*float64(p.Processed)/float64(p.Total), units.Bytes(p.Total), units.Bytes(p.Sent))
	case p.Phase != "":
		return p.Phase
	}
	return "-"
}

// StateText is a job's state for people, with the reason it did not
// succeed (shortened to 60 characters, unsafe characters escaped).
func (j *Job) StateText() string {
	if j.Reason == "" || j.State == Succeeded {
		return string(j.State)
	}
	reason := termsafe.Text(j.Reason)
	if len(reason) > 60 {
		reason = reason[:59] + "…"
	}
	return string(j.State) + " (" + reason + ")"
}

// WaitSucceeded waits for job id as Wait does, and returns it with no error
// only when it SUCCEEDED; every error says what can be done next (wait
// again, cancel, resume, read the log). It returns nil and the error when
// no job is id.
func (s *Store) WaitSucceeded(ctx context.Context, id string, timeout time.Duration) (*Job, error) {
	j, err := s.Wait(ctx, id, timeout)
	switch {
	case j == nil:
		return nil, err
	case errors.Is(err, ErrWaitTimeout):
		return j, fmt.Errorf("job %s is still %s (%s) after %v\n  wait again: bdnvol jobs wait %s\n  cancel it:  bdnvol jobs cancel %s",
			j.ID, j.State, j.ProgressText(), timeout, j.ID, j.ID)
	case err != nil && ctx.Err() != nil:
		return j, fmt.Errorf("stopped waiting; job %s is still %s (%s)\n  wait again: bdnvol jobs wait %s\n  cancel it:  bdnvol jobs cancel %s",
			j.ID, j.State, j.ProgressText(), j.ID, j.ID)
	case err != nil:
		return j, err
	}
	switch j.State {
	case Succeeded:
		return j, nil
	case Canceled:
		return j, fmt.Errorf("job %s was canceled: %s; resume it with: bdnvol jobs resume %s", j.ID, j.Reason, j.ID)
	default:
		return j, fmt.Errorf("job %s failed: %s; resume it with: bdnvol jobs resume %s (log: bdnvol jobs logs %s)", j.ID, j.Reason, j.ID, j.ID)
	}
}
