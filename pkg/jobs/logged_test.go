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
