// Package e2e holds the end-to-end tests of the bdnvol CLI: the real binary,
// built once per run, talking to real registries served in-process.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	binPath  string // the CLI built by TestMain
	buildErr error  // why it could not be built, reported by tests that need it
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(mmapReaderEnv); spec != "" {
		os.Exit(mmapReader(spec))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "bdnvol-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	binPath = filepath.Join(tmp, "bdnvol")
	cmd := exec.Command("go", "build", "-o", binPath, "github.com/bdnvol/bdnvol/cmd/bdnvol")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		buildErr = fmt.Errorf("go build ./cmd/bdnvol: %v\n%s", err, out)
	}
	return m.Run()
}

// bin returns the path of the CLI binary, failing the test when it did not build.
func bin(t testing.TB) string {
	t.Helper()
	if buildErr != nil {
		t.Fatalf("the CLI did not build: %v", buildErr)
	}
	return binPath
}

// result is what one run of the CLI produced.
type result struct {
	args   []string
	stdout string
	stderr string
	code   int
	maxRSS int64 // the process's peak resident memory, bytes (0 if unknown)
}

func (r result) String() string {
	return fmt.Sprintf("bdnvol %s\nexit code: %d\n--- stdout ---\n%s--- stderr ---\n%s",
		strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// lastLine is the last non-empty line of stdout.
func (r result) lastLine() string {
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

var (
	homesMu sync.Mutex
	homes   = map[testing.TB]string{}
)

// home is the per-test directory used as HOME, XDG_CACHE_HOME and DOCKER_CONFIG,
// so no test sees another's stat cache or the user's credentials.
func home(t testing.TB) string {
	t.Helper()
	homesMu.Lock()
	defer homesMu.Unlock()
	if h, ok := homes[t]; ok {
		return h
	}
	h := t.TempDir()
	homes[t] = h
	t.Cleanup(func() {
		homesMu.Lock()
		delete(homes, t)
		homesMu.Unlock()
	})
	return h
}

const runTimeout = 2 * time.Minute

// run runs the CLI with args and returns its output and exit code; it fails the
// test only if the binary could not be started or ran past runTimeout.
func run(t testing.TB, args ...string) result {
	t.Helper()
	return runIn(t, "", args...)
}

// runIn is run with the working directory set to dir ("" keeps the test's).
func runIn(t testing.TB, dir string, args ...string) result {
	t.Helper()
	return runFor(t, dir, runTimeout, args...)
}

// runFor is runIn with a time limit of its own, for the few runs that
// move gigabytes.
func runFor(t testing.TB, dir string, limit time.Duration, args ...string) result {
	t.Helper()
	h := home(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t), args...)
	cmd.Dir = dir
	env := []string{}
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "HOME", "XDG_CACHE_HOME", "DOCKER_CONFIG", "XDG_CONFIG_HOME",
			"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy":
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "HOME="+h, "XDG_CACHE_HOME="+h, "DOCKER_CONFIG="+h)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{args: args, stdout: stdout.String(), stderr: stderr.String(), maxRSS: peakRSS(cmd.ProcessState)}
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("timed out after %v:\n%s", limit, res)
	case err == nil:
	case errors.As(err, &exitErr):
		res.code = exitErr.ExitCode()
	default:
		t.Fatalf("bdnvol %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// mustRun runs the CLI and fails the test unless it exits 0.
func mustRun(t testing.TB, args ...string) result {
	t.Helper()
	res := run(t, args...)
	if res.code != 0 {
		t.Fatalf("expected success:\n%s", res)
	}
	return res
}

// peakRSS returns the peak resident memory of a process that exited, in
// bytes, or 0 when the system does not say.
func peakRSS(ps *os.ProcessState) int64 {
	if ps == nil {
		return 0
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0
	}
	if runtime.GOOS == "darwin" {
		return int64(ru.Maxrss) // bytes
	}
	return int64(ru.Maxrss) << 10 // KiB
}
