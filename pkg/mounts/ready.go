package mounts

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/pkg/profile"
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
//
// handoff, when not nil, is called in a goroutine while the daemon starts;
// what it returns is written to the daemon on a pipe of its own
// (HandoffFDEnv), for Handoff. Once the daemon is ready, Daemonize still
// waits (at most handoffLinger, and not past ctx) until the handoff is
// written: its last part, the profile lookups, may come after the roots.
func Daemonize(ctx context.Context, exe string, args []string, logPath string, handoff func() []Target) (Daemon, error) {
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
	var hw *os.File
	if handoff != nil {
		var hr *os.File
		if hr, hw, err = os.Pipe(); err != nil {
			pw.Close()
			return Daemon{}, err
		}
		defer hr.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, hr)
		cmd.Env = append(cmd.Env, HandoffFDEnv+"=4")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		if hw != nil {
			hw.Close()
		}
		return Daemon{}, fmt.Errorf("start the mount daemon: %w", err)
	}
	pw.Close()
	written := make(chan struct{})
	if hw != nil {
		go func() {
			defer close(written)
			defer hw.Close()
			writeHandoff(hw, handoff())
		}()
	} else {
		close(written)
	}
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
			// The daemon may still wait for the profile lookups, the
			// handoff's last part: the caller's context (which they
			// use) ends when this returns.
			select {
			case <-written:
			case <-exited:
			case <-ctx.Done():
			case <-time.After(handoffLinger):
			}
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

// HandoffFDEnv names the environment variable that tells a daemonised
// mount the file descriptor on which the process that started it hands it
// what it resolved (Handoff).
const HandoffFDEnv = "BDNVOL_MOUNT_HANDOFF_FD"

// handoffLinger bounds how long Daemonize, once the daemon is ready, waits
// for the handoff to be written.
var handoffLinger = 5 * time.Second

// maxHandoffBytes bounds what Handoff reads of the roots.
const maxHandoffBytes = 4 << 20

// handoffEntry is one target resolved by the starting process.
type handoffEntry struct {
	Ref        string             `json:"ref"`
	Mountpoint string             `json:"mountpoint"`
	Root       ocispec.Descriptor `json:"root"`
}

// handoffProfile is the profile lookup the starting process did for one
// target, written after every root (a second JSON value).
type handoffProfile struct {
	Ref        string         `json:"ref"`
	Mountpoint string         `json:"mountpoint"`
	Lookup     profile.Lookup `json:"lookup"`
}

// writeHandoff writes the roots of targets, then, once every lookup is
// done, their profile lookups.
func writeHandoff(w io.Writer, targets []Target) {
	var es []handoffEntry
	for _, t := range targets {
		if t.Root.Digest != "" {
			es = append(es, handoffEntry{t.Ref.String(), t.Mountpoint, t.Root})
		}
	}
	if json.NewEncoder(w).Encode(es) != nil {
		return
	}
	var ps []handoffProfile
	for _, t := range targets {
		if t.Root.Digest == "" || t.Profile == nil {
			continue
		}
		if l, ok := t.Profile(context.Background()); ok {
			ps = append(ps, handoffProfile{t.Ref.String(), t.Mountpoint, l})
		}
	}
	_ = json.NewEncoder(w).Encode(ps)
}

// Handoff, in a process started by Daemonize with a handoff, waits (at most
// wait, and not past ctx) for what the starting process resolved, and
// returns targets with the Root of each it resolved set (the same
// reference at the same mountpoint). Without a handoff, or when it does not
// come in time or does not parse, targets are returned as they are: the
// daemon resolves them itself.
//
// Each target given a Root also gets a Profile that waits (at most wait
// again, and not past ctx or its own context) for the profile lookup the
// starting process writes after the roots; false when none comes.
func Handoff(ctx context.Context, targets []Target, wait time.Duration) []Target {
	fd, err := strconv.Atoi(os.Getenv(HandoffFDEnv))
	if err != nil {
		return targets
	}
	os.Unsetenv(HandoffFDEnv)
	// Non-blocking, so that the read deadline below applies.
	if unix.SetNonblock(fd, true) != nil {
		unix.Close(fd)
		return targets
	}
	f := os.NewFile(uintptr(fd), "handoff")
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if f.SetReadDeadline(deadline) != nil {
		f.Close()
		return targets
	}
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()) })
	lr := &io.LimitedReader{R: f, N: maxHandoffBytes}
	dec := json.NewDecoder(lr)
	var es []handoffEntry
	if err := dec.Decode(&es); err != nil {
		stop()
		f.Close()
		return targets
	}
	var ps []handoffProfile
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer f.Close()
		defer stop()
		if f.SetReadDeadline(time.Now().Add(wait)) != nil || ctx.Err() != nil {
			return
		}
		// A profile document is at most profile.MaxBytes, a third more
		// in JSON's base64.
		lr.N += int64(len(es)) * (profile.MaxBytes/3*4 + 4<<10)
		var got []handoffProfile
		if dec.Decode(&got) == nil {
			ps = got
		}
	}()
	out := slices.Clone(targets)
	for i, t := range out {
		for _, e := range es {
			if e.Ref == t.Ref.String() && e.Mountpoint == t.Mountpoint {
				out[i].Root = e.Root
			}
		}
		if out[i].Root.Digest == "" {
			continue
		}
		out[i].Profile = func(wctx context.Context) (profile.Lookup, bool) {
			select {
			case <-done:
			case <-wctx.Done():
				return profile.Lookup{}, false
			}
			for _, p := range ps {
				if p.Ref == t.Ref.String() && p.Mountpoint == t.Mountpoint {
					return p.Lookup, true
				}
			}
			return profile.Lookup{}, false
		}
	}
	return out
}
