package versions

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestVerifyDirReportsDifferences(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	files := map[string][]byte{"a": []byte("one"), "sub/b": []byte("two")}
	if _, err := publishTree(t, tg, files, PublishOptions{Tag: "main"}); err != nil {
		t.Fatal(err)
	}
	ref := oci.Ref{Layout: "/vol", Tag: "main"}
	root, err := Resolve(ctx, tg, ref)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	testutil.WriteTree(t, dir, files)
	got, err := VerifyDir(ctx, tg, ref, root, dir, nil)
	if err != nil || !got.OK || got.Reference != ref.Pinned(root.Desc.Digest) || got.Dir != dir || len(got.Differences) != 0 {
		t.Fatalf("same tree: %+v, %v", got, err)
	}
	if b, _ := json.Marshal(got); !strings.Contains(string(b), `"differences":[]`) {
		t.Errorf("JSON of no differences: %s", b)
	}
	os.WriteFile(filepath.Join(dir, "a"), []byte("One"), 0o644)
	os.WriteFile(filepath.Join(dir, "extra"), nil, 0o644)
	got, err = VerifyDir(ctx, tg, ref, root, dir, nil)
	if err != nil || got.OK || len(got.Differences) != 2 {
		t.Fatalf("changed tree: %+v, %v", got, err)
	}
	if _, err := VerifyDir(ctx, tg, ref, root, filepath.Join(dir, "none"), nil); err == nil || !strings.Contains(err.Error(), "verify "+filepath.Join(dir, "none")+" against ") {
		t.Errorf("missing directory: %v", err)
	}
}
