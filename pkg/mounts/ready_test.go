package mounts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// helperEnv makes the test binary act as a mount daemon (see TestMain).
const helperEnv = "BDNVOL_MOUNTS_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "ready":
		notify, closeFn := Notifier()
		defer closeFn()
		if os.Getenv(ReadyFDEnv) != "" {
			fmt.Fprintln(os.Stderr, "bdnvol: the ready descriptor leaked into the environment")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "bdnvol: serving")
		notify([]string{"r.example/a@sha256:01", "r.example/b@sha256:02"})
		time.Sleep(100 * time.Millisecond)
		os.Exit(0)
	case "fail":
		fmt.Fprintln(os.Stderr, "bdnvol: starting")
		fmt.Fprintln(os.Stderr, "bdnvol: r.example/a:v1: not found")
		os.Exit(1)
	case "silent":
		os.Exit(1)
	}
}

func TestReadyLine(t *testing.T) {
	var b bytes.Buffer
	writeReady(&b, []string{"x@sha256:1", "y@sha256:2"})
	got, ok := readReady(&b)
	if !ok || !reflect.DeepEqual(got, []string{"x@sha256:1", "y@sha256:2"}) {
		t.Fatalf("readReady = %q, %v", got, ok)
	}
	for _, in := range []string{"", "error: no\n", "ready"} {
		if got, ok := readReady(strings.NewReader(in)); ok && in != "ready" {
			t.Errorf("readReady(%q) = %q, true; want false", in, got)
		}
	}
}

func daemonize(t *testing.T, mode string) (Daemon, error) {
	t.Helper()
	t.Setenv(helperEnv, mode)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return Daemonize(ctx, exe, nil, filepath.Join(t.TempDir(), "logs", "d.log"))
}

func TestDaemonizeReady(t *testing.T) {
	d, err := daemonize(t, "ready")
	if err != nil {
		t.Fatal(err)
	}
	if d.PID <= 0 || !reflect.DeepEqual(d.Pinned, []string{"r.example/a@sha256:01", "r.example/b@sha256:02"}) {
		t.Fatalf("Daemon = %+v", d)
	}
	time.Sleep(300 * time.Millisecond)
	b, err := os.ReadFile(d.Log)
	if err != nil || !strings.Contains(string(b), "bdnvol: serving") || strings.Contains(string(b), "leaked") {
		t.Fatalf("daemon log: %q, %v", b, err)
	}
}

func TestDaemonizeFailure(t *testing.T) {
	_, err := daemonize(t, "fail")
	if err == nil || err.Error() != "r.example/a:v1: not found" {
		t.Fatalf("Daemonize error = %v; want the last line of the daemon's log", err)
	}
	_, err = daemonize(t, "silent")
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("Daemonize error = %v; want ErrNotReady", err)
	}
}
