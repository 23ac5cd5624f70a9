package jobs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/proc"
)

func newJob(t *testing.T) (*Store, *Job) {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	j, err := s.Create(Spec{Source: "hf://org/a", Destination: "oci:/x:a"})
	if err != nil {
		t.Fatal(err)
	}
	return s, j
}

// waitFor polls the job until ok holds, failing the test after a generous while.
func waitFor(t *testing.T, s *Store, id string, ok func(*Job) bool) *Job {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		j, err := s.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if ok(j) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s never reached the expected state; last: %+v", id, j)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunRecordsSuccessAttemptAndResult(t *testing.T) {
	s, j := newJob(t)
	got, err := s.Run(context.Background(), j.ID[:6], func(ctx context.Context, j *Job, r *Reporter) (Result, error) {
		if j.State != Running || j.PID != os.Getpid() || j.Attempts != 1 || j.Progress.Phase != "listing" {
			t.Errorf("work sees the job as %+v", j)
		}
		r.SetPhase("transferring", 3)
		r.Sample(func(p *Progress) { p.Total, p.Processed, p.Sent = 30, 20, 10 })
		return Result{Reference: "r@sha256:ab", Digest: "sha256:ab", Commit: "c0", BytesUploaded: 10}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != Succeeded || got.Reference != "r@sha256:ab" || got.Digest != "sha256:ab" || got.Commit != "c0" ||
		got.BytesUploaded != 10 || got.PID != 0 || got.Finished.IsZero() {
		t.Fatalf("finished job: %+v", got)
	}
	want := Progress{Phase: "transferring", Files: 3, Total: 30, Processed: 20, Sent: 10}
	if got.Progress != want {
		t.Fatalf("final progress %+v, want %+v", got.Progress, want)
	}
	// A job that ended is not run again.
	called := false
	again, err := s.Run(context.Background(), j.ID, func(context.Context, *Job, *Reporter) (Result, error) {
		called = true
		return Result{}, nil
	})
	if err == nil || again != nil || called || !strings.Contains(err.Error(), "SUCCEEDED") {
		t.Fatalf("second run of a finished job: job %v, err %v, work called %v", again, err, called)
	}
}

func TestRunRecordsFailureAndRequeueRunsItAgain(t *testing.T) {
	s, j := newJob(t)
	boom := errors.New("source said no")
	got, err := s.Run(context.Background(), j.ID, func(context.Context, *Job, *Reporter) (Result, error) {
		return Result{}, boom
	})
	if !errors.Is(err, boom) || errors.Is(err, ErrStopped) {
		t.Fatalf("err = %v", err)
	}
	if got.State != Failed || got.Reason != boom.Error() {
		t.Fatalf("failed job: %s (%s)", got.State, got.Reason)
	}
	if _, err := s.Requeue(j.ID); err != nil {
		t.Fatal(err)
	}
	got, err = s.Run(context.Background(), j.ID, func(_ context.Context, j *Job, _ *Reporter) (Result, error) {
		if j.Attempts != 2 || j.Reason != "" {
			t.Errorf("second attempt sees %+v", j)
		}
		return Result{Reference: "r"}, nil
	})
	if err != nil || got.State != Succeeded || got.Attempts != 2 {
		t.Fatalf("second attempt: %+v, %v", got, err)
	}
	if _, err := s.Requeue(j.ID); err == nil || !strings.Contains(err.Error(), "already succeeded") {
		t.Fatalf("requeue of a succeeded job: %v", err)
	}
	if j, err := s.Requeue("nope"); j != nil || !errors.Is(err, ErrNotFound) {
		t.Fatalf("requeue of no job: %v, %v", j, err)
	}
}

func TestRunRecordsProgressWhileRunningAndStopsOnCancelRequest(t *testing.T) {
	s, j := newJob(t)
	done := make(chan struct{})
	var got *Job
	var err error
	go func() {
		defer close(done)
		got, err = s.Run(context.Background(), j.ID, func(ctx context.Context, _ *Job, r *Reporter) (Result, error) {
			r.SetPhase("transferring", 7)
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), ErrCanceled) {
				t.Errorf("cause %v", context.Cause(ctx))
			}
			return Result{}, ctx.Err()
		})
	}()
	waitFor(t, s, j.ID, func(j *Job) bool { return j.Progress.Phase == "transferring" && j.Progress.Files == 7 })
	// Request the cancel as Cancel does (without its SIGTERM, which would
	// reach this test process).
	if _, err := s.Update(j.ID, func(j *Job) error { j.CancelRequested = true; return nil }); err != nil {
		t.Fatal(err)
	}
	<-done
	if !errors.Is(err, ErrStopped) || !errors.Is(err, context.Canceled) {
		t.Fatalf("run err = %v", err)
	}
	if got.State != Canceled || got.Reason != ReasonCanceled {
		t.Fatalf("canceled job: %s (%s)", got.State, got.Reason)
	}
}

func TestRunInterruptedBySignalContext(t *testing.T) {
	s, j := newJob(t)
	ctx, cancel := context.WithCancel(context.Background())
	got, err := s.Run(ctx, j.ID, func(ctx context.Context, _ *Job, _ *Reporter) (Result, error) {
		cancel()
		return Result{}, ctx.Err()
	})
	if !errors.Is(err, ErrStopped) || got.State != Canceled || got.Reason != ReasonInterrupted {
		t.Fatalf("interrupted job: %+v, %v", got, err)
	}
}

func TestCancelOfAJobNothingRunsCancelsItAtOnce(t *testing.T) {
	s, j := newJob(t)
	got, err := s.Cancel(context.Background(), j.ID)
	if err != nil || got.State != Canceled || got.Reason != ReasonCanceled {
		t.Fatalf("cancel: %+v, %v", got, err)
	}
	if _, err := s.Cancel(context.Background(), j.ID); err == nil || !strings.Contains(err.Error(), "already CANCELED") {
		t.Fatalf("second cancel: %v", err)
	}
	if got, err := s.Cancel(context.Background(), "nope"); got != nil || !errors.Is(err, ErrNotFound) {
		t.Fatalf("cancel of no job: %v, %v", got, err)
	}
}

func TestWaitReturnsEndTimeoutAndContext(t *testing.T) {
	s, j := newJob(t)
	// Mark it RUNNING in this live process so it does not read as interrupted.
	if _, err := s.Update(j.ID, func(j *Job) error {
		j.State, j.PID, j.PIDStart = Running, os.Getpid(), proc.Start(os.Getpid())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Wait(context.Background(), j.ID, time.Millisecond)
	if !errors.Is(err, ErrWaitTimeout) || got == nil || got.State != Running {
		t.Fatalf("wait with a timeout: %+v, %v", got, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got, err = s.Wait(ctx, j.ID, 0); !errors.Is(err, context.Canceled) || got == nil {
		t.Fatalf("wait with a done context: %+v, %v", got, err)
	}
	go s.Update(j.ID, func(j *Job) error { j.State, j.Reference = Succeeded, "r"; return nil })
	if got, err = s.Wait(context.Background(), j.ID, 0); err != nil || got.State != Succeeded || got.Reference != "r" {
		t.Fatalf("wait for the end: %+v, %v", got, err)
	}
	if got, err = s.Wait(context.Background(), "nope", 0); got != nil || !errors.Is(err, ErrNotFound) {
		t.Fatalf("wait for no job: %+v, %v", got, err)
	}
}

func TestSpawnLogsOutputAndAProcessThatExitsEarlyReadsInterrupted(t *testing.T) {
	s, j := newJob(t)
	if err := s.Spawn(j.ID, exec.Command("sh", "-c", "echo started")); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, s, j.ID, func(j *Job) bool { return j.Done() })
	if got.State != Failed || !strings.Contains(got.Reason, "interrupted") {
		t.Fatalf("job of a process that exited: %s (%s)", got.State, got.Reason)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(s.LogPath(j.ID))
		if strings.Contains(string(b), "started") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log holds %q", b)
		}
		time.Sleep(20 * time.Millisecond)
	}

	_, k := newJob(t)
	s2, _ := Open(t.TempDir())
	k2, _ := s2.Create(k.Spec)
	if err := s2.Spawn(k2.ID, exec.Command("/nonexistent/bdnvol")); err == nil {
		t.Fatal("spawning a missing program succeeded")
	}
	if got, _ := s2.Get(k2.ID); got.State != Failed || !strings.Contains(got.Reason, "could not start") {
		t.Fatalf("job of a process that did not start: %s (%s)", got.State, got.Reason)
	}
}

func TestResumeRequeuesAndDetachesTheJobsRunCommand(t *testing.T) {
	s, j := newJob(t)
	if _, err := s.Run(context.Background(), j.ID, func(context.Context, *Job, *Reporter) (Result, error) {
		return Result{}, errors.New("source said no")
	}); err == nil {
		t.Fatal("failing work succeeded")
	}
	exe := filepath.Join(t.TempDir(), "fake-bdnvol")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\necho args: \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := s.Resume(j.ID[:6], exe)
	if err != nil || got.ID != j.ID {
		t.Fatalf("resume: %+v, %v", got, err)
	}
	waitFor(t, s, j.ID, func(j *Job) bool { return j.Done() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(s.LogPath(j.ID))
		if strings.Contains(string(b), "args: jobs run "+j.ID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log holds %q, want the jobs run command", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, err := s.Resume("nope", exe); got != nil || !errors.Is(err, ErrNotFound) {
		t.Fatalf("resume of no job: %v, %v", got, err)
	}
	_, k := newJob(t)
	s2, _ := Open(t.TempDir())
	k2, _ := s2.Create(k.Spec)
	if got, err := s2.Resume(k2.ID, exe); got == nil || err == nil || !strings.Contains(err.Error(), "QUEUED") {
		t.Fatalf("resume of a queued job: %v, %v", got, err)
	}
}

func TestStateText(t *testing.T) {
	long := strings.Repeat("x", 100) + "\x1b[31m"
	for _, c := range []struct {
		j    Job
		want string
	}{
		{Job{State: Running}, "RUNNING"},
		{Job{State: Succeeded, Reason: "ignored"}, "SUCCEEDED"},
		{Job{State: Failed, Reason: "no \x1b"}, `FAILED (no \x1b)`},
		{Job{State: Failed, Reason: long}, "FAILED (" + strings.Repeat("x", 59) + "…)"},
	} {
		if got := c.j.StateText(); got != c.want {
			t.Errorf("%s (%q): %q, want %q", c.j.State, c.j.Reason, got, c.want)
		}
	}
}
