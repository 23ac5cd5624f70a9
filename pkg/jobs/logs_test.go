package jobs

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

func TestCopyLog(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	j, err := s.Create(Spec{Source: "hf://org/m", Destination: "oci:/tmp/x:main"})
	if err != nil {
		t.Fatal(err)
	}
	var out testutil.SyncBuffer
	if err := s.CopyLog(ctx, j.ID, &out, false); err != nil || out.String() != "" {
		t.Fatalf("no log yet: %q, %v", out.String(), err)
	}
	if err := os.WriteFile(s.LogPath(j.ID), []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyLog(ctx, j.ID[:6], &out, false); err != nil || out.String() != "one\n" {
		t.Fatalf("by prefix: %q, %v", out.String(), err)
	}
	if err := s.CopyLog(ctx, "nosuchjob", &out, false); !errors.Is(err, ErrNotFound) {
		t.Errorf("a missing job: %v", err)
	}

	// Following: lines written later arrive, and it returns once the job ends.
	var follow testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- s.CopyLog(ctx, j.ID, &follow, true) }()
	f, err := os.OpenFile(s.LogPath(j.ID), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("two\n")
	f.Close()
	time.Sleep(2 * logPoll)
	select {
	case err := <-done:
		t.Fatalf("CopyLog returned while the job runs: %v", err)
	default:
	}
	if _, err := s.Update(j.ID, func(j *Job) error { j.State = Succeeded; return nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || follow.String() != "one\ntwo\n" {
			t.Errorf("followed %q, %v", follow.String(), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("CopyLog did not return after the job ended")
	}
}
