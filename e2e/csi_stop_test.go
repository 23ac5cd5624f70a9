package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestCSIMounterStopsPromptlyWithBoundTargets: SIGTERM to the mounter while
// pods still bind its mount (one of them with a file open) ends it within a
// few seconds; it used to wait for ever on the bound FUSE connection.
func TestCSIMounterStopsPromptlyWithBoundTargets(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/vols/stop"
	_, _, _ = csiVersions(t, repo)
	n := startCSI(t, time.Minute)
	a, b := n.newPod("a"), n.newPod("b")
	n.mustPublish(a, repo+":prod", "")
	n.mustPublish(b, repo+":prod", "")
	waitReadable(t, filepath.Join(a.target, "readme.txt"))
	f, err := os.Open(filepath.Join(b.target, "readme.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(n.fuseMounts()) != 1 {
		t.Fatalf("FUSE mounts %v, want one", n.fuseMounts())
	}

	n.stopNode() // kubelet's plugin is gone too; the binds stay
	start := time.Now()
	if err := n.mounter.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.mounter.Wait() }()
	select {
	case err := <-done:
		took := time.Since(start)
		t.Logf("mounter exited %v after SIGTERM (%v)", took.Round(time.Millisecond), err)
		if took > 8*time.Second {
			t.Errorf("the mounter took %v to exit", took)
		}
	case <-time.After(30 * time.Second):
		n.mounter.Process.Kill()
		<-done
		n.mounter = nil
		t.Fatalf("the mounter did not exit within 30s of SIGTERM while pods bind its mount")
	}
	n.mounter = nil
	if ms := n.fuseMounts(); len(ms) != 0 {
		t.Errorf("the mounter's FUSE mounts are still there: %v", ms)
	}
}
