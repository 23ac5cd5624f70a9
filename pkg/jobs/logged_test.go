package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

var stamped = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ `)

func TestRunLoggedForegroundLogsToWriterAndFile(t *testing.T) {
	s, j := newJob(t)
	var w bytes.Buffer
	got, err := s.RunLogged(context.Background(), j.ID, &w, true, func(ctx context.Context, j *Job, r *Reporter, logf Logf) (Result, error) {
		logf("listing %s\x1b[2J", j.Spec.Source) // a terminal escape from the source is made safe
		return Result{Reference: "r@sha256:ab", Summary: "sealed 2 files"}, nil
	})
	if err != nil || got.State != Succeeded || got.Reference != "r@sha256:ab" {
		t.Fatalf("RunLogged = %+v, %v", got, err)
	}
	lines := strings.Split(strings.TrimSuffix(w.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("log:\n%s", w.String())
	}
	for _, l := range lines {
		if !stamped.MatchString(l) || strings.Contains(l, "\x1b") {
			t.Errorf("line %q is not time-stamped and terminal-safe", l)
		}
	}
	if !strings.HasSuffix(lines[0], "job "+j.ID+" attempt 1: sync hf://org/a to oci:/x:a") ||
		!strings.HasSuffix(lines[2], "job "+j.ID+": sealed 2 files") {
		t.Errorf("log:\n%s", w.String())
	}
	file, err := os.ReadFile(s.LogPath(j.ID))
	if err != nil || string(file) != w.String() {
		t.Errorf("log file = %q, %v; want what the writer got", file, err)
	}
}

func TestRunLoggedDetachedFailureSaysHowToResume(t *testing.T) {
	s, j := newJob(t)
	var w bytes.Buffer
	boom := errors.New("source gone")
	got, err := s.RunLogged(context.Background(), j.ID, &w, false, func(context.Context, *Job, *Reporter, Logf) (Result, error) {
		return Result{}, boom
	})
	if got == nil || got.State != Failed || !errors.Is(err, boom) ||
		!strings.Contains(err.Error(), "job "+j.ID+" failed: source gone; after fixing the cause, resume it with: bdnvol jobs resume "+j.ID) {
		t.Fatalf("RunLogged = %+v, %v", got, err)
	}
	if !strings.Contains(w.String(), "job "+j.ID+": source gone\n") {
		t.Errorf("log lacks the failure:\n%s", w.String())
	}
	// Not in the foreground: the log file is the process's output, not written here.
	if _, err := os.Stat(s.LogPath(j.ID)); !os.IsNotExist(err) {
		t.Errorf("log file written by a detached run: %v", err)
	}
	// A stopped job says so.
	s.Requeue(j.ID)
	ctx, cancel := context.WithCancel(context.Background())
	_, err = s.RunLogged(ctx, j.ID, &w, false, func(ctx context.Context, _ *Job, _ *Reporter, _ Logf) (Result, error) {
		cancel()
		<-ctx.Done()
		return Result{}, ctx.Err()
	})
	if !errors.Is(err, ErrStopped) || !strings.Contains(err.Error(), "job "+j.ID+" stopped: ") {
		t.Errorf("stopped: %v", err)
	}
	// A job that cannot start is not logged.
	w.Reset()
	if got, err := s.RunLogged(context.Background(), "nope", &w, false, nil); got != nil || !errors.Is(err, ErrNotFound) || w.Len() != 0 {
		t.Errorf("unknown job: %+v, %v, log %q", got, err, w.String())
	}
}

func TestSummaryJSON(t *testing.T) {
	_, j := newJob(t)
	j.Reference, j.Attempts = "r@sha256:ab", 2
	b, err := json.Marshal(j.Summary())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	if m["source"] != "hf://org/a" || m["destination"] != "oci:/x:a" || m["reference"] != "r@sha256:ab" || m["attempts"] != 2.0 ||
		m["state"] != "QUEUED" || m["spec"] != nil || m["pid_start"] != nil {
		t.Errorf("summary JSON %s", b)
	}
}

func TestProgressText(t *testing.T) {
	for _, c := range []struct {
		j    Job
		want string
	}{
		{Job{State: Succeeded, BytesUploaded: 2048}, "100%, 2.0 KiB uploaded"},
		{Job{State: Running, Progress: Progress{Total: 4096, Processed: 1024, Sent: 512}}, "25% of 4.0 KiB, 512 B uploaded"},
		{Job{State: Running, Progress: Progress{Phase: "listing"}}, "listing"},
		{Job{State: Queued}, "-"},
	} {
		if got := c.j.ProgressText(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.j, got, c.want)
		}
	}
}

func TestWaitSucceededSaysWhatToDoNext(t *testing.T) {
	s, j := newJob(t)
	if got, err := s.WaitSucceeded(context.Background(), "nope", 0); got != nil || !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown job: %v, %v", got, err)
	}
	// Running in this process (so not interrupted): a timeout.
	s.Update(j.ID, func(j *Job) error { j.State, j.PID = Running, os.Getpid(); return nil })
	_, err := s.WaitSucceeded(context.Background(), j.ID, 10*time.Millisecond)
	if err == nil || !strings.HasPrefix(err.Error(), "job "+j.ID+" is still RUNNING (-) after 10ms") ||
		!strings.Contains(err.Error(), "wait again: bdnvol jobs wait "+j.ID) {
		t.Fatalf("timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.WaitSucceeded(ctx, j.ID, 0); err == nil || !strings.HasPrefix(err.Error(), "stopped waiting; job "+j.ID) {
		t.Fatalf("canceled wait: %v", err)
	}
	s.Update(j.ID, func(j *Job) error { j.State, j.Reason = Failed, "boom"; return nil })
	if _, err := s.WaitSucceeded(context.Background(), j.ID, 0); err == nil ||
		err.Error() != "job "+j.ID+" failed: boom; resume it with: bdnvol jobs resume "+j.ID+" (log: bdnvol jobs logs "+j.ID+")" {
		t.Fatalf("failed job: %v", err)
	}
	s.Update(j.ID, func(j *Job) error { j.State, j.Reason = Canceled, ReasonCanceled; return nil })
	if _, err := s.WaitSucceeded(context.Background(), j.ID, 0); err == nil || !strings.HasPrefix(err.Error(), "job "+j.ID+" was canceled: ") {
		t.Fatalf("canceled job: %v", err)
	}
	s.Update(j.ID, func(j *Job) error { j.State, j.Reference = Succeeded, "r@sha256:ab"; return nil })
	if got, err := s.WaitSucceeded(context.Background(), j.ID, 0); err != nil || got.Reference != "r@sha256:ab" {
		t.Fatalf("succeeded job: %+v, %v", got, err)
	}
}
