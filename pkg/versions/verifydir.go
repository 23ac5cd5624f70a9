package versions

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
)

// DirCheck is a directory compared with a version.
type DirCheck struct {
	Digest      string              `json:"digest"`
	Reference   string              `json:"reference"` // REPO@DIGEST
	Dir         string              `json:"dir"`
	OK          bool                `json:"ok"` // no difference
	Differences []layout.Difference `json:"differences"`
}

// VerifyDir compares dir with version root of the repository ref names,
// opened as t: every file's size, mode and SHA-256, symlink targets, extra
// and missing entries (see layout.CompareDir); with sel (nil for all), only
// the entries a pull with that selection writes.
func VerifyDir(ctx context.Context, t oci.Target, ref oci.Ref, root *Root, dir string, sel func(path string) bool) (*DirCheck, error) {
	d := root.Desc.Digest
	v, err := origin.Open(ctx, t, root.Desc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	diffs, err := layout.CompareDir(ctx, v, dir, sel)
	if err != nil {
		return nil, fmt.Errorf("verify %s against %s: %w", dir, ref.Pinned(d), err)
	}
	if diffs == nil {
		diffs = []layout.Difference{}
	}
	return &DirCheck{Digest: d.String(), Reference: ref.Pinned(d), Dir: dir, OK: len(diffs) == 0, Differences: diffs}, nil
}
