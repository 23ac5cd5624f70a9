package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// goTool is a CLI the tests run that go install builds from the module
// proxy: pkg@version into toolDir, kept between runs, unless the
// environment variable env names a binary.
type goTool struct {
	name, pkg, version, env string

	once sync.Once
	bin  string
	err  error
}

// toolDir is where a tool is installed, kept between runs: $BDNVOL_TOOLS,
// else the user cache directory's bdnvol-tools, one directory per version.
func toolDir(name, version string) string {
	if d := os.Getenv("BDNVOL_TOOLS"); d != "" {
		return filepath.Join(d, name+"-"+version)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "bdnvol-tools", name+"-"+version)
}

// path returns the tool's binary, installing it the first time (minutes).
func (g *goTool) path(t testing.TB) string {
	t.Helper()
	g.once.Do(func() {
		if p := os.Getenv(g.env); p != "" {
			g.bin = p
			return
		}
		dir := toolDir(g.name, g.version)
		p := filepath.Join(dir, g.name)
		if runtime.GOOS == "windows" {
			p += ".exe"
		}
		if _, err := os.Stat(p); err == nil {
			g.bin = p
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "install", g.pkg+"@"+g.version)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off", "GOFLAGS=")
		cmd.Dir = os.TempDir()
		if out, err := cmd.CombinedOutput(); err != nil {
			g.err = fmt.Errorf("go install %s@%s: %v\n%s", g.pkg, g.version, err, out)
			return
		}
		g.bin = p
	})
	if g.err != nil {
		t.Fatal(g.err)
	}
	return g.bin
}
