package csi

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/pkg/mounts"
)

// target is one published volume: a pod's target path bound to a digest's
// mount. Its file in the state directory is what refcounts the digest
// across restarts of the node plugin. It holds no credentials.
type target struct {
	VolumeID string `json:"volume_id"`
	Path     string `json:"target_path"`
	Ref      string `json:"ref"`    // as the pod wrote it
	Pinned   string `json:"pinned"` // what it resolved to
	Digest   string `json:"digest"`
	Pod      string `json:"pod,omitempty"`
	Bytes    int64  `json:"bytes"`
	Files    int64  `json:"files"`
}

// targets is the directory of target records.
type targets struct{ dir string }

func (ts targets) path(p string) string { return filepath.Join(ts.dir, mounts.Key(p)+".json") }

func (ts targets) write(t target) error {
	if err := os.MkdirAll(ts.dir, 0o700); err != nil {
		return fmt.Errorf("state of %s: %w", t.Path, err)
	}
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(ts.path(t.Path), b, 0o600); err != nil {
		return fmt.Errorf("state of %s: %w", t.Path, err)
	}
	return nil
}

func (ts targets) read(p string) (target, bool) {
	var t target
	b, err := os.ReadFile(ts.path(p))
	if err != nil || json.Unmarshal(b, &t) != nil || t.Path != p {
		return target{}, false
	}
	return t, true
}

func (ts targets) remove(p string) { os.Remove(ts.path(p)) }

// all returns every record.
func (ts targets) all() []target {
	es, _ := os.ReadDir(ts.dir)
	var out []target
	for _, e := range es {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		var t target
		b, err := os.ReadFile(filepath.Join(ts.dir, e.Name()))
		if err == nil && json.Unmarshal(b, &t) == nil && t.Path != "" {
			out = append(out, t)
		}
	}
	return out
}
