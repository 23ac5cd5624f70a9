package versions

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestParseRefWantsAVersion(t *testing.T) {
	if _, err := ParseRef("example.com/vol"); !errors.Is(err, ErrNoVersion) || !strings.Contains(err.Error(), "example.com/vol") {
		t.Errorf("repository only: %v, want ErrNoVersion naming it", err)
	}
	if _, err := ParseRef("Bad Ref:x"); err == nil || errors.Is(err, ErrNoVersion) {
		t.Errorf("unparsable reference: %v, want the parse error", err)
	}
	for _, s := range []string{"example.com/vol:v1", "example.com/vol@sha256:" + strings.Repeat("a", 64), "oci:/tmp/x:v1"} {
		ref, err := ParseRef(s)
		if err != nil || ref.Reference() == "" {
			t.Errorf("%s: %+v, %v", s, ref, err)
		}
	}
}

func TestOpenResolvesTheVersion(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "vol")
	tg, err := oci.Open(ctx, oci.Ref{Layout: dir}, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res := pushVersion(t, tg, map[string][]byte{"a": []byte("a")}, t0, "v1")
	ref, err := ParseRef("oci:" + dir + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	_, root, err := Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if root.Desc.Digest != res.Root.Digest {
		t.Errorf("opened %s, want %s", root.Desc.Digest, res.Root.Digest)
	}
	ref.Tag = "v2"
	if _, _, err := Open(ctx, ref, oci.Options{}); err == nil {
		t.Error("opened a tag that does not exist")
	}
}

func TestCheckTags(t *testing.T) {
	if err := CheckTags("v1", "prod", "latest"); err != nil {
		t.Errorf("good tags: %v", err)
	}
	if err := CheckTags("v1", "no spaces"); !errors.Is(err, ErrBadTag) || !strings.Contains(err.Error(), `"no spaces"`) {
		t.Errorf("bad tag: %v, want ErrBadTag naming it", err)
	}
	if err := CheckTags(oci.SealedTagPrefix + "x"); !errors.Is(err, ErrReservedTag) {
		t.Errorf("reserved tag: %v, want ErrReservedTag", err)
	}
}

func TestPushParams(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	if p, err := PushParams(ctx, tg, "main", layout.Params{}); err != nil || p != layout.DefaultParams {
		t.Errorf("nothing given, empty repository: %+v, %v; want the defaults", p, err)
	}
	pushVersion(t, tg, map[string][]byte{"a": testutil.Pattern(1, 100<<10)}, t0, "main")
	if p, err := PushParams(ctx, tg, "main", layout.Params{}); err != nil || p != smallParams.Inherited() {
		t.Errorf("nothing given: %+v, %v; want main's %+v", p, err, smallParams.Inherited())
	}
	if p, err := PushParams(ctx, tg, "main", layout.Params{Avg: 32 << 10}); err != nil || p.Avg != 32<<10 || p.Min == 0 || p.Max == 0 {
		t.Errorf("avg given: %+v, %v; want it completed", p, err)
	}
	if _, err := PushParams(ctx, tg, "main", layout.Params{Min: 10}); err == nil {
		t.Error("min 10 accepted")
	}
}

func TestParseRepo(t *testing.T) {
	if ref, err := ParseRepo("reg.example/vol", "gc"); err != nil || ref.Repo() != "reg.example/vol" {
		t.Errorf("repository: %+v, %v", ref, err)
	}
	err := func() error { _, err := ParseRepo("reg.example/vol:v1", "gc"); return err }()
	if !errors.Is(err, ErrNotRepository) || err.Error() != "reg.example/vol:v1: gc takes a repository, without a tag or digest" {
		t.Errorf("tagged: %v", err)
	}
	if _, err := ParseRepo("Not A Ref", "gc"); err == nil || errors.Is(err, ErrNotRepository) {
		t.Errorf("bad reference: %v", err)
	}
}

func TestParsePushRef(t *testing.T) {
	if ref, err := ParsePushRef("reg.example/vol:main", []string{"stable"}); err != nil || ref.Tag != "main" {
		t.Errorf("tagged: %+v, %v", ref, err)
	}
	if ref, err := ParsePushRef("reg.example/vol", nil); err != nil || ref.Tag != "" {
		t.Errorf("untagged: %+v, %v", ref, err)
	}
	d := "reg.example/vol@sha256:" + strings.Repeat("c", 64)
	if _, err := ParsePushRef(d, nil); !errors.Is(err, ErrPushDigest) || !strings.Contains(err.Error(), d) {
		t.Errorf("digest: %v", err)
	}
	if _, err := ParsePushRef("reg.example/vol:main", []string{HistoryTagPrefix + "x"}); !errors.Is(err, ErrReservedTag) {
		t.Errorf("reserved extra tag: %v", err)
	}
	if _, err := ParsePushRef("reg.example/vol:"+oci.SealedTagPrefix+"x", nil); !errors.Is(err, ErrReservedTag) {
		t.Errorf("reserved tag: %v", err)
	}
}
