package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Dataset shape of issue 18: many small files in a hundred directories.
const (
	datasetFiles = 100_000
	datasetDirs  = 100
	datasetSize  = 1 << 10
)

// writeDataset writes n files of size pseudo-random bytes, spread over
// dirs directories, under root.
func writeDataset(t testing.TB, root string, n, dirs, size int) {
	t.Helper()
	r := rand.New(rand.NewPCG(18, 1018))
	buf := make([]byte, size)
	for d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("d%03d", d)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		for k := 0; k+8 <= size; k += 8 {
			v := r.Uint64()
			for j := range 8 {
				buf[k+j] = byte(v >> (8 * j))
			}
		}
		p := filepath.Join(root, fmt.Sprintf("d%03d", i%dirs), fmt.Sprintf("f%07d.bin", i))
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// limitedCmd is the CLI with args, run by a shell that first lowers the
// limit of open files to nofile.
func limitedCmd(t testing.TB, ctx context.Context, nofile int, args ...string) *exec.Cmd {
	t.Helper()
	script := fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile)
	cmd := exec.CommandContext(ctx, "sh", append([]string{"-c", script, bin(t)}, args...)...)
	cmd.Env = cliEnv(t)
	return cmd
}

// runLimited runs the CLI under a limit of nofile open files.
func runLimited(t testing.TB, nofile int, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := limitedCmd(t, ctx, nofile, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{args: args, stdout: stdout.String(), stderr: stderr.String()}
	if ctx.Err() != nil {
		t.Fatalf("timed out after %v:\n%s", runTimeout, res)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		res.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("bdnvol %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// countFiles counts the regular files under root, leaving out bdnvol's
// private directory.
func countFiles(t testing.TB, root string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".bdnvol-") {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// noPrivateDir fails the test if a pull left its private directory in dir.
func noPrivateDir(t testing.TB, dir string) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(dir, ".bdnvol-pull")); !os.IsNotExist(err) {
		names, _ := filepath.Glob(filepath.Join(dir, ".bdnvol-pull", "*"))
		t.Errorf("%s: private directory left after a pull (%v, %d entries)", dir, err, len(names))
	}
}

// TestDatasetPull: a volume of 100,000 files of 1 KiB in 100 directories
// pulls under a limit of 256 open files, from a registry and from an OCI
// layout, bit-exact; a pull killed midway leaves only the temporaries of
// the files it was writing, and a second pull finishes it bit-exact; a
// mount of the volume walks bit-exact.
func TestDatasetPull(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "src")
	writeDataset(t, src, datasetFiles, datasetDirs, datasetSize)
	reg := newDistribution(t)
	repo := reg.Host + "/data/images"
	push(t, repo, repo+":v1", src)
	layout := "oci:" + filepath.Join(base, "layout")
	push(t, layout, layout+":v1", src)

	for name, ref := range map[string]string{"registry": repo + ":v1", "oci-layout": layout + ":v1"} {
		t.Run("ulimit-256/"+name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			if res := runLimited(t, 256, "pull", ref, dst); res.code != 0 {
				t.Fatalf("pull under ulimit -n 256:\n%s", res)
			}
			compareTrees(t, src, dst)
			noPrivateDir(t, dst)
		})
	}

	t.Run("killed-then-resumed", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "dst")
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		cmd := limitedCmd(t, ctx, 256, "pull", "--jobs", "4", repo+":v1", dst)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill it once about a third of the files are in place.
		first := filepath.Join(dst, fmt.Sprintf("d%03d", datasetDirs/3))
		for {
			if des, err := os.ReadDir(first); err == nil && len(des) > 0 {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("no file in place before the timeout:\n%s", out.String())
			}
			time.Sleep(2 * time.Millisecond)
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		placed := countFiles(t, dst)
		if placed >= datasetFiles {
			t.Fatalf("premise: the pull was killed before it finished, but all %d files are in place", placed)
		}
		temps, _ := filepath.Glob(filepath.Join(dst, ".bdnvol-pull", "*.part"))
		// Per job: the file being written and one continued from the
		// neighbouring chunk.
		if len(temps) > 16 {
			t.Errorf("%d temporary files left by a pull with 4 jobs killed midway", len(temps))
		}
		t.Logf("killed with %d of %d files in place and %d temporaries", placed, datasetFiles, len(temps))
		res := runLimited(t, 256, "pull", "--json", repo+":v1", dst)
		if res.code != 0 {
			t.Fatalf("resumed pull:\n%s", res)
		}
		var pr struct {
			FilesReused int `json:"files_reused"`
		}
		mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &pr)
		if placed > 0 && pr.FilesReused < placed {
			t.Errorf("resumed pull reused %d files, %d were in place", pr.FilesReused, placed)
		}
		compareTrees(t, src, dst)
		noPrivateDir(t, dst)
	})

	t.Run("mount-walk", func(t *testing.T) {
		mp := mount(t, repo+":v1")
		compareTrees(t, src, mp)
	})
}
