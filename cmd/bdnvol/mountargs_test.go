package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/versions"
)

func TestMountTargetsOneVersion(t *testing.T) {
	mp := t.TempDir()
	targets, key, err := mountTargets("example.com/vol:v1", mp, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(targets) != 1 || targets[0].Mountpoint != mp || targets[0].Ref.Tag != "v1" || key != mp {
		t.Errorf("targets %+v, log key %s", targets, key)
	}
	if _, _, err := mountTargets("example.com/vol:v1", "", "", "", nil); !errors.Is(err, errNoMountpoint) {
		t.Errorf("no mountpoint: %v", err)
	}
	if _, _, err := mountTargets("example.com/vol", mp, "", "", nil); !errors.Is(err, versions.ErrNoVersion) {
		t.Errorf("no tag or digest: %v", err)
	}
	if _, _, err := mountTargets("example.com/vol:v1", mp, "", filepath.Join(mp, "missing.pub"), nil); err == nil || !strings.Contains(err.Error(), "missing.pub") {
		t.Errorf("missing key: %v", err)
	}
}

func TestMountTargetsSpec(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "bdnvol.yaml")
	yaml := "mounts:\n  - source: example.com/a:v1\n    path: /models/a\n    readOnly: true\n"
	if err := os.WriteFile(spec, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	targets, key, err := mountTargets(root, "", spec, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(targets) != 1 || targets[0].Mountpoint != filepath.Join(root, "models/a") || key != root {
		t.Errorf("targets %+v, log key %s", targets, key)
	}
	if _, _, err := mountTargets(root, filepath.Join(dir, "mp"), spec, "", nil); !errors.Is(err, errSpecMountpoint) {
		t.Errorf("spec and a mountpoint: %v", err)
	}
	if _, _, err := mountTargets(root, "", filepath.Join(dir, "none.yaml"), "", nil); err == nil {
		t.Error("missing spec accepted")
	}
}
