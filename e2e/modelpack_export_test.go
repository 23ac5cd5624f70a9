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

// OrasVersion is the oras CLI the ModelPack interop test pulls with.
const OrasVersion = "v1.3.6"

// orasTool is the oras CLI ($BDNVOL_ORAS, else installed once).
var orasTool = &goTool{name: "oras", pkg: "oras.land/oras/cmd/oras", version: OrasVersion, env: "BDNVOL_ORAS"}

// exportedModelPack is the JSON object `bdnvol export-modelpack --json` prints.
type exportedModelPack struct {
	Image         string `json:"image"`
	Digest        string `json:"digest"`
	Attached      string `json:"attached"`
	Volume        string `json:"volume"`
	Layers        int    `json:"layers"`
	Bytes         int64  `json:"bytes"`
	SharedLayers  int    `json:"shared_layers"`
	SharedBytes   int64  `json:"shared_bytes"`
	BytesUploaded int64  `json:"bytes_uploaded"`
	Config        struct {
		Architecture string `json:"architecture"`
		Format       string `json:"format"`
		ParamSize    string `json:"paramSize"`
		Precision    string `json:"precision"`
	} `json:"config"`
}

func exportModelPack(t *testing.T, args ...string) exportedModelPack {
	t.Helper()
	res := mustRun(t, append([]string{"export-modelpack", "--json"}, args...)...)
	var e exportedModelPack
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &e); err != nil || !strings.HasPrefix(e.Digest, "sha256:") {
		t.Fatalf("export-modelpack --json: want one JSON object (%v):\n%s", err, res)
	}
	return e
}

// TestExportModelPackOrasPull exports a version of a generated checkpoint
// as a ModelPack view with the real CLI, twice (the same digest, the second
// time nothing uploaded), and pulls the view with the oras CLI, an
// independent reader: it writes every file of the version, bit-identical;
// so does bdnvol's own pull of the view as a ModelPack model.
// It logs what the view costs in storage.
func TestExportModelPackOrasPull(t *testing.T) {
	oras := orasTool.path(t)
	forKinds(t, []string{"distribution", "ggcr-referrers", "oci-layout"}, func(t *testing.T, tg target) {
		src := filepath.Join(t.TempDir(), "src")
		if err := synth.Generate(src, synth.Options{TargetBytes: 24 << 20, Shards: 3, Seed: 29}); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(src, "extra"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, "extra", "README.md"), []byte("# notes\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		repo := tg.repo("team/mp")
		p := dedupPushJSON(t, repo+":v1", src)
		e1 := exportModelPack(t, repo+":v1")
		e2 := exportModelPack(t, repo+"@"+p.Digest)
		if e2.Digest != e1.Digest || e2.BytesUploaded != 0 || e1.Attached != e1.Image {
			t.Fatalf("two exports of one version:\n%+v\n%+v", e1, e2)
		}
		if e1.Config.Format != "safetensors" || e1.Config.ParamSize == "" || e1.Config.Precision == "" || e1.Config.Architecture == "" {
			t.Errorf("config %+v: want format, paramSize, precision and architecture from the files", e1.Config)
		}
		t.Logf("version %d bytes; view %d layers, %d bytes, %d layers (%d bytes) shared with the version's chunks, uploaded %d bytes (%.2fx the version)",
			p.Bytes, e1.Layers, e1.Bytes, e1.SharedLayers, e1.SharedBytes, e1.BytesUploaded, float64(e1.BytesUploaded)/float64(p.Bytes))

		out := filepath.Join(t.TempDir(), "pulled")
		args := []string{"pull", "--plain-http", "-o", out, repo + "@" + e1.Digest}
		if tg.reg == nil {
			args = []string{"pull", "--oci-layout", "-o", out, strings.TrimPrefix(repo, "oci:") + "@" + e1.Digest}
		}
		cmd := exec.Command(oras, args...)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("oras pull: %v\n%s", err, b)
		}
		compareContents(t, src, out)

		// bdnvol reads the view back as a ModelPack model: the same files.
		back := filepath.Join(t.TempDir(), "back")
		mustRun(t, "pull", repo+"@"+e1.Digest, back)
		compareContents(t, src, back)
	})
}

// compareContents fails unless the regular files under want and got have
// the same paths and bytes.
func compareContents(t *testing.T, want, got string) {
	t.Helper()
	files := func(root string) map[string]string {
		m := map[string]string{}
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			if d.Type().IsRegular() {
				rel, _ := filepath.Rel(root, p)
				m[rel] = string(fileContents(t, p))
			}
			return nil
		})
		return m
	}
	w, g := files(want), files(got)
	if len(w) != len(g) {
		t.Fatalf("%d files pulled, want %d", len(g), len(w))
	}
	for p, b := range w {
		if g[p] != b {
			t.Fatalf("%s: %d bytes pulled, want %d, bit-identical", p, len(g[p]), len(b))
		}
	}
}
