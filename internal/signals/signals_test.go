package signals

import (
	"os"
	"syscall"
	"testing"
	"time"
)

func TestFirstSignalCancelsSecondIsHandedOver(t *testing.T) {
	again := make(chan os.Signal, 1)
	ctx, stop := Context(func(s os.Signal) { again <- s })
	defer stop()
	if ctx.Err() != nil {
		t.Fatal("canceled before any signal")
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not cancel the context")
	}
	select {
	case s := <-again:
		t.Fatalf("again called with %v after one signal", s)
	default:
	}
	syscall.Kill(os.Getpid(), syscall.SIGINT)
	select {
	case s := <-again:
		if s != os.Interrupt {
			t.Errorf("again(%v), want interrupt", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second signal was not handed over")
	}
}

func TestStopCancelsWithoutSignals(t *testing.T) {
	ctx, stop := Context(func(os.Signal) { t.Error("again called without a signal") })
	stop()
	if ctx.Err() == nil {
		t.Error("stop did not cancel the context")
	}
}

func TestExitCode(t *testing.T) {
	if c := ExitCode(syscall.SIGTERM); c != 143 {
		t.Errorf("SIGTERM: %d", c)
	}
	if c := ExitCode(os.Interrupt); c != 130 {
		t.Errorf("SIGINT: %d", c)
	}
}
