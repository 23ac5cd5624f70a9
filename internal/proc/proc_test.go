package proc

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

func TestAlive(t *testing.T) {
	me := os.Getpid()
	if !Alive(me, "") || !Alive(me, Start(me)) {
		t.Fatal("this process is not alive")
	}
	if Alive(0, "") || Alive(-1, "") || Alive(1<<30, "") {
		t.Error("a PID that names no process is alive")
	}
	if runtime.GOOS != "linux" {
		return
	}
	if Start(me) == "" {
		t.Fatal("no start time for this process on Linux")
	}
	if Alive(me, "1") {
		t.Error("a process with another start time is alive")
	}
	// A child that exited and is not reaped yet is a zombie.
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for Alive(cmd.Process.Pid, "") {
		if time.Now().After(deadline) {
			t.Fatal("an exited, unreaped child is still alive")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
