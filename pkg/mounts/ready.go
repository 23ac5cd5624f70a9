package mounts

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ReadyFDEnv names the environment variable that tells a daemonised mount
// the file descriptor on which to report that it is ready.
const ReadyFDEnv = "BDNVOL_MOUNT_READY_FD"

// readyPrefix starts the line a daemon writes when its mounts are ready;
// the pinned references it serves follow, separated by spaces.
const readyPrefix = "ready "

// ErrNotReady is wrapped when a daemon exits before its mount is ready.
var ErrNotReady = errors.New("exited before the mount was ready")

// Daemon is a started mount daemon that reported ready.
type Daemon struct {
	PID    int
	Pinned []string // the pinned references it serves
	Log    string   // the file its output goes to
}

// IsDaemon reports whether this process was started by Daemonize.
func IsDaemon() bool { return os.Getenv(ReadyFDEnv) != "" }

// Notifier returns the function a process started by Daemonize calls once
// its mounts are ready, with the pinned references it serves; it reports
// nothing when this process was not started by Daemonize. Call the returned
// close function when done (it is safe after notify).
func Notifier() (notify func(pinned []string), closeFn func()) {
	fd, err := strconv.Atoi(os.Getenv(ReadyFDEnv))
	if err != nil {
		return func([]string) {}, func() {}
	}
	os.Unsetenv(ReadyFDEnv)
	pipe := os.NewFile(uintptr(fd), "ready")
	return func(pinned []string) { writeReady(pipe, pinned); pipe.Close() }, func() { pipe.Close() }
}

// writeReady writes the ready line for pinned to w.
func writeReady(w io.Writer, pinned []string) {
	fmt.Fprintln(w, readyPrefix+strings.Join(pinned, " "))
}

// readReady reads the ready line from r; false when r ends without one.
func readReady(r io.Reader) ([]string, bool) {
	s, _ := bufio.NewReader(r).ReadString('\n')
	rest, ok := strings.CutPrefix(strings.TrimSpace(s), strings.TrimSpace(readyPrefix))
	if !ok {
		return nil, false
	}
	return strings.Fields(rest), true
}

// Daemonize starts exe with args again, detached in its own session with
// its output in logPath, and waits until it reports ready or exits. When it
// exits first, the error is the last line of its log.
func Daemonize(ctx context.Context, exe string, args []string, logPath string) (Daemon, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return Daemon{}, fmt.Errorf("mount daemon log: %w", err)
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return Daemon{}, fmt.Errorf("mount daemon log: %w", err)
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return Daemon{}, err
	}
	defer pr.Close()
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), ReadyFDEnv+"=3")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return Daemon{}, fmt.Errorf("start the mount daemon: %w", err)
	}
	pw.Close()
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	type ready struct {
		pinned []string
		ok     bool
	}
	line := make(chan ready, 1)
	go func() {
		p, ok := readReady(pr)
		line <- ready{p, ok}
	}()
	select {
	case r := <-line:
		if r.ok {
			return Daemon{PID: cmd.Process.Pid, Pinned: r.pinned, Log: logPath}, nil
		}
	case <-ctx.Done():
		cmd.Process.Signal(syscall.SIGTERM)
		return Daemon{}, ctx.Err()
	}
	<-exited
	return Daemon{}, lastLogLine(logPath)
}

// lastLogLine is the error a daemon that exited early left in its log.
func lastLogLine(logPath string) error {
	b, _ := os.ReadFile(logPath)
	msg := strings.TrimSpace(string(b))
	msg = strings.TrimPrefix(msg[strings.LastIndex(msg, "\n")+1:], "bdnvol: ")
	if msg == "" {
		return ErrNotReady
	}
	return errors.New(msg)
}
