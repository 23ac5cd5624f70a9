package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// untrustedLayout pushes two versions of a small tree to a fresh layout and
// returns the layout's directory, its name and the two digests.
func untrustedLayout(t *testing.T) (dir, repo, d1, d2 string) {
	t.Helper()
	root := t.TempDir()
	dir = filepath.Join(root, "vol")
	repo = "oci:" + dir
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, []node{
		fileNode("a.bin", 0o644, randBytes(71, 300<<10)),
		fileNode("b.txt", 0o644, []byte("b\n")),
	}, time.Time{})
	d1 = pushJSON(t, repo+":v1", src, smallChunks...).Digest
	buildTree(t, src, []node{fileNode("c.txt", 0o644, []byte("c\n"))}, time.Time{})
	d2 = pushJSON(t, repo+":v2", src, smallChunks...).Digest
	return dir, repo, d1, d2
}

// TestLayoutReadOnlyCommandsWriteNothing: commands that only read a layout
// leave it byte-identical: no lock file, no new or changed file.
func TestLayoutReadOnlyCommandsWriteNothing(t *testing.T) {
	dir, repo, d1, d2 := untrustedLayout(t)
	if err := os.Remove(filepath.Join(dir, ".bdnvol-index.lock")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "ingest")); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, dir)
	for _, args := range [][]string{
		{"versions", repo},
		{"versions", "--json", repo},
		{"inspect", repo + ":v1"},
		{"inspect", repo + "@" + d2},
		{"resolve", repo + ":v2"},
		{"diff", repo + ":v1", repo + ":v2"},
		{"history", repo + ":v1"},
		{"pull", "--no-cache", repo + ":v2", filepath.Join(t.TempDir(), "out")},
		{"pull", repo + "@" + d1, filepath.Join(t.TempDir(), "out")},
	} {
		mustRun(t, args...)
	}
	if diffs := diffSnapshots(before, snapshot(t, dir)); len(diffs) > 0 {
		t.Errorf("read-only commands changed the layout:\n  %s", strings.Join(diffs, "\n  "))
	}

	// A directory that is not a layout stays empty too.
	empty := t.TempDir()
	res := run(t, "versions", "oci:"+empty)
	t.Logf("versions of an empty directory: %s", res)
	if ents, _ := os.ReadDir(empty); len(ents) != 0 {
		t.Errorf("versions of an empty directory created %v", ents)
	}
}

// TestLayoutSymlinkedFilesRefused: a layout whose index.json or lock file
// is a symlink is refused, and the symlink's target is left alone.
func TestLayoutSymlinkedFilesRefused(t *testing.T) {
	for _, name := range []string{"index.json", ".bdnvol-index.lock"} {
		t.Run(name, func(t *testing.T) {
			dir, repo, _, _ := untrustedLayout(t)
			elsewhere := filepath.Join(t.TempDir(), "elsewhere")
			if err := os.Rename(filepath.Join(dir, name), elsewhere); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(elsewhere, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			want := fileContents(t, elsewhere)
			for _, args := range [][]string{{"versions", repo}, {"tag", repo + ":v1", "prod"}} {
				res := run(t, args...)
				if res.code != 1 {
					t.Errorf("exit code %d, want 1:\n%s", res.code, res)
				}
				if line := oneLine(t, res); !strings.Contains(line, name) {
					t.Errorf("stderr does not name %s: %q", name, line)
				}
			}
			if got := fileContents(t, elsewhere); string(got) != string(want) {
				t.Errorf("the symlink's target changed")
			}
		})
	}
}

// TestLayoutFIFOs: a FIFO as index.json or as a blob is refused at once
// with an error naming it, instead of blocking in open(2).
func TestLayoutFIFOs(t *testing.T) {
	t.Run("index.json", func(t *testing.T) {
		dir, repo, _, _ := untrustedLayout(t)
		p := filepath.Join(dir, "index.json")
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"versions", repo}, {"pull", repo + ":v1", filepath.Join(t.TempDir(), "out")}} {
			res := runWithin(t, 30*time.Second, args...)
			if res.code != 1 || !strings.Contains(res.stderr, "index.json") {
				t.Errorf("want exit 1 naming index.json:\n%s", res)
			}
		}
	})
	t.Run("blob", func(t *testing.T) {
		dir, repo, d1, _ := untrustedLayout(t)
		var m ociManifest
		mustJSON(t, layoutBlob(t, dir, d1), &m)
		chunk := m.Layers[len(m.Layers)-1].Digest
		p := filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(chunk, "sha256:"))
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
		res := runWithin(t, 30*time.Second, "pull", "--no-cache", repo+"@"+d1, filepath.Join(t.TempDir(), "out"))
		if res.code != 1 || !strings.Contains(res.stderr, strings.TrimPrefix(chunk, "sha256:")[:12]) {
			t.Errorf("want exit 1 naming chunk %s:\n%s", chunk, res)
		}
	})
}

// runWithin runs the CLI and fails the test if it has not exited after d.
func runWithin(t *testing.T, d time.Duration, args ...string) result {
	t.Helper()
	done := make(chan result, 1)
	cmd := exec.Command(bin(t), args...)
	cmd.Env = append(os.Environ(), "HOME="+home(t), "XDG_CACHE_HOME="+home(t), "DOCKER_CONFIG="+home(t))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := cmd.Wait()
		res := result{args: args, stdout: stdout.String(), stderr: stderr.String()}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			res.code = ee.ExitCode()
		}
		done <- res
	}()
	select {
	case res := <-done:
		return res
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		t.Fatalf("bdnvol %s: still running after %v", strings.Join(args, " "), d)
		return result{}
	}
}

// TestSecondSignalExits: the first SIGINT asks a command to stop; a second
// one ends it at once, even where it is stuck outside anything a context
// reaches (here: open(2) of a FIFO given as --ca-file).
func TestSecondSignalExits(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "ca.pem")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t), "versions", "--ca-file", fifo, "127.0.0.1:1/vol")
	cmd.Env = append(os.Environ(), "HOME="+home(t), "XDG_CACHE_HOME="+home(t), "DOCKER_CONFIG="+home(t))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	time.Sleep(time.Second) // let it reach the FIFO
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Logf("exited on the first signal: %v %s", err, stderr.String())
		return
	case <-time.After(500 * time.Millisecond):
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("after two SIGINTs: %v, want exit code 130; stderr: %s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("still running 10s after a second SIGINT; stderr: %s", stderr.String())
	}
}
