package jobs

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/bdnvol/bdnvol/internal/proc"
)

func TestCreateUpdateListAndInterruptedJobs(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Create(Spec{Source: "hf://org/a", Destination: "oci:/x:a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Create(Spec{Source: "hf://org/b", Destination: "oci:/x:b"})
	if err != nil {
		t.Fatal(err)
	}

	// A RUNNING job whose process is gone reads as FAILED/interrupted.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := cmd.Process.Pid
	if _, err := s.Update(a.ID, func(j *Job) error { j.State, j.PID = Running, dead; return nil }); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(a.ID[:8])
	if err != nil {
		t.Fatal(err)
	}
	if got.State != Failed || !strings.Contains(got.Reason, "interrupted") {
		t.Fatalf("dead RUNNING job reads as %s (%s)", got.State, got.Reason)
	}
	// This process is alive, and a PID reused by another process is not.
	if _, err := s.Update(b.ID, func(j *Job) error {
		j.State, j.PID, j.PIDStart = Running, os.Getpid(), proc.Start(os.Getpid())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(b.ID); got.State != Running {
		t.Fatalf("live job reads as %s", got.State)
	}
	if proc.Start(os.Getpid()) != "" && proc.Alive(os.Getpid(), "1") {
		t.Fatal("a process with another start time counts as alive")
	}

	// Concurrent updates are serialised: none is lost.
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := s.Update(b.ID, func(j *Job) error { j.Attempts++; return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got, _ := s.Get(b.ID); got.Attempts != 20 {
		t.Fatalf("attempts %d after 20 updates", got.Attempts)
	}
	// A failing update writes nothing.
	boom := errors.New("boom")
	if _, err := s.Update(b.ID, func(j *Job) error { j.State = Canceled; return boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if got, _ := s.Get(b.ID); got.State != Running {
		t.Fatalf("failed update wrote state %s", got.State)
	}

	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].ID != b.ID {
		t.Fatalf("list: %v %v", list, err)
	}
	if _, err := s.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get nope: %v", err)
	}
	if _, err := s.Get("../x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get ../x: %v", err)
	}
	entries, _ := os.ReadDir(s.Dir())
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}
