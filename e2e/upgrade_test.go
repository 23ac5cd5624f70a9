package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

type upgradePull struct {
	BytesFetched int64 `json:"bytes_fetched"`
	BytesCopied  int64 `json:"bytes_copied"`
	FilesReused  int   `json:"files_reused"`
	FilesRemoved int   `json:"files_removed"`
}

func upgradePullJSON(t *testing.T, ref, dir string) upgradePull {
	t.Helper()
	res := mustRun(t, "pull", "--json", ref, dir)
	var p upgradePull
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &p); err != nil {
		t.Fatalf("pull --json: %v\n%s", err, res)
	}
	return p
}

// TestPullUpgradeFetchesChanges pulls v1 of a checkpoint, then its
// fine-tune v2 into the same directory: the registry serves little more
// than the changed tensors, and the tree is v2's, bit for bit (compared
// with the source and with `bdnvol verify`).
func TestPullUpgradeFetchesChanges(t *testing.T) {
	bin(t)
	reg := newDistribution(t)
	repo := "model"
	base := t.TempDir()
	v1, v2 := filepath.Join(base, "v1"), filepath.Join(base, "v2")
	opts := synth.Options{TargetBytes: 24 << 20, Shards: 3, Seed: 1, Layers: 2, Hidden: 768, Intermediate: 1024}
	if err := synth.Generate(v1, opts); err != nil {
		t.Fatal(err)
	}
	rep, err := synth.FineTune(v1, v2, synth.FineTuneOptions{Fraction: 0.30, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	ref1, ref2 := reg.Host+"/"+repo+":v1", reg.Host+"/"+repo+":v2"
	push(t, reg.Host+"/"+repo, ref1, v1)
	push(t, reg.Host+"/"+repo, ref2, v2)

	out := filepath.Join(t.TempDir(), "out")
	upgradePullJSON(t, ref1, out)
	compareTrees(t, v1, out)
	reg.ResetStats()
	up := upgradePullJSON(t, ref2, out)
	served := reg.Stats().BlobBytesOut
	compareTrees(t, v2, out)
	mustRun(t, "verify", ref2, out)

	var smallFiles int64
	entries, err := os.ReadDir(v2)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && fi.Size() < 1<<20 {
			smallFiles += fi.Size()
		}
	}
	changed := rep.ChangedTensorBytes + rep.NewTensorBytes
	limit := int64(1.05*float64(changed)) + rep.ChangedHeaderBytes + smallFiles + metadataBytes(t, reg, repo, "v2")
	t.Logf("upgrade v1→v2: registry served %d bytes (pull: fetched %d, copied %d, %d files kept); changed tensors %d of %d; limit %d",
		served, up.BytesFetched, up.BytesCopied, up.FilesReused, changed, rep.TotalBytes, limit)
	if served > limit {
		t.Errorf("upgrade fetched %d bytes, want <= %d (1.05 × %d changed tensor bytes + headers, small files, metadata)", served, limit, changed)
	}
	if up.BytesCopied == 0 {
		t.Error("the upgrade copied nothing from v1's files")
	}

	// A directory of v1's files that no pull wrote: files of the same name
	// are cut as a push would, and their chunks reused after checking them.
	plain := filepath.Join(t.TempDir(), "plain")
	if err := exec.Command("cp", "-a", v1, plain).Run(); err != nil {
		t.Fatal(err)
	}
	reg.ResetStats()
	up = upgradePullJSON(t, ref2, plain)
	served = reg.Stats().BlobBytesOut
	t.Logf("v2 over a copy of v1: registry served %d of %d bytes, copied %d", served, rep.TotalBytes, up.BytesCopied)
	if served > limit || up.BytesCopied == 0 {
		t.Errorf("v2 over a copy of v1 fetched %d of %d bytes (limit %d), copied %d", served, rep.TotalBytes, limit, up.BytesCopied)
	}
	compareTrees(t, v2, plain)
}

// TestVerifyDirectory: `bdnvol verify REF DIR` exits 0 on a pulled tree and
// 1 with a listing (text and JSON) once a file changes; without DIR it is
// a usage error.
func TestVerifyDirectory(t *testing.T) {
	reg := newDistribution(t)
	src := t.TempDir()
	for name, data := range map[string]string{"a.txt": "alpha\n", "d/b.bin": strings.Repeat("b", 5000)} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ref := reg.Host + "/vol:v1"
	push(t, reg.Host+"/vol", ref, src)
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, "pull", "--verify-files", ref, out)
	mustRun(t, "verify", ref, out)
	if err := os.WriteFile(filepath.Join(out, "a.txt"), []byte("ALPHA\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "extra"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := run(t, "verify", ref, out)
	if res.code != 1 || !strings.Contains(res.stdout, "a.txt: digest") || !strings.Contains(res.stdout, "extra: extra") {
		t.Errorf("verify of a changed tree: want exit 1 listing a.txt and extra:\n%s", res)
	}
	res = run(t, "verify", "--json", ref, out)
	var v struct {
		OK          bool `json:"ok"`
		Differences []struct {
			Path, Kind string
		} `json:"differences"`
	}
	if res.code != 1 || json.Unmarshal([]byte(res.stdout), &v) != nil || v.OK || len(v.Differences) != 2 {
		t.Errorf("verify --json of a changed tree: %+v\n%s", v, res)
	}
	if res := run(t, "verify", ref); res.code != 2 {
		t.Errorf("verify without a directory: want exit 2:\n%s", res)
	}
}
