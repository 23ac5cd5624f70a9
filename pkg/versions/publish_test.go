package versions

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

func publishTree(t *testing.T, tg oci.Target, files map[string][]byte, opt PublishOptions) (*Published, error) {
	t.Helper()
	dir := t.TempDir()
	testutil.WriteTree(t, dir, files)
	return Publish(context.Background(), tg, push.DirSource(dir), opt)
}

func historyOf(t *testing.T, tg oci.Target, tag string) []Move {
	t.Helper()
	h, err := ReadHistory(context.Background(), tg, tag)
	if err != nil {
		t.Fatal(err)
	}
	return h.Moves
}

func TestPublishSealsTagsProtectsAndRecordsHistory(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	if got := PreviousParams(ctx, tg, "main"); got != layout.DefaultParams {
		t.Fatalf("params of an empty repository: %+v", got)
	}

	v1, err := publishTree(t, tg, map[string][]byte{"a": testutil.Pattern(1, 100<<10)}, PublishOptions{
		Tag: "main", Extra: []string{"stable"}, Push: push.Options{Params: smallParams}, Now: t0,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(v1.Tags) != 3 || v1.Tags[1] != "main" || v1.Tags[2] != "stable" {
		t.Fatalf("tags %v", v1.Tags)
	}
	if _, _, ok := oci.ParseProtectiveTag(v1.Tags[0]); !ok {
		t.Fatalf("first tag %q is not a protective tag", v1.Tags[0])
	}
	for _, tag := range v1.Tags {
		d, err := tg.Resolve(ctx, tag)
		if err != nil || d.Digest != v1.Root.Digest {
			t.Fatalf("%s resolves to %v (%v), want %s", tag, d.Digest, err, v1.Root.Digest)
		}
	}
	if ms := historyOf(t, tg, "main"); len(ms) != 1 || ms[0].Digest != v1.Root.Digest || ms[0].Previous != "" ||
		ms[0].Op != OpPush || !ms[0].Time.Equal(t0) {
		t.Fatalf("history of main after the first publish: %+v", ms)
	}

	// Zero params: the new version is chunked like the one main points at.
	v2, err := publishTree(t, tg, map[string][]byte{"a": testutil.Pattern(2, 100<<10)}, PublishOptions{Tag: "main"})
	if err != nil {
		t.Fatal(err)
	}
	if v2.Index.Chunking != smallParams {
		t.Fatalf("second version chunked with %+v, want the first's %+v", v2.Index.Chunking, smallParams)
	}
	ms := historyOf(t, tg, "main")
	if len(ms) != 2 || ms[1].Digest != v2.Root.Digest || ms[1].Previous != v1.Root.Digest {
		t.Fatalf("history of main after the second publish: %+v", ms)
	}
	if d, _ := tg.Resolve(ctx, "stable"); d.Digest != v1.Root.Digest {
		t.Fatalf("stable moved to %s", d.Digest)
	}

	// Publishing the same tree again moves nothing and records nothing.
	again, err := publishTree(t, tg, map[string][]byte{"a": testutil.Pattern(2, 100<<10)}, PublishOptions{Tag: "main"})
	if err != nil {
		t.Fatal(err)
	}
	if again.Root.Digest != v2.Root.Digest || again.Tags[0] != v2.Tags[0] {
		t.Fatalf("republish: %s %v, want %s %v", again.Root.Digest, again.Tags, v2.Root.Digest, v2.Tags)
	}
	if ms := historyOf(t, tg, "main"); len(ms) != 2 {
		t.Fatalf("republish recorded a move: %+v", ms)
	}
}

func TestPublishCheckFailureTagsNothing(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	bad := errors.New("file a differs from the source")
	var checked *layout.Index
	_, err := publishTree(t, tg, map[string][]byte{"a": testutil.Pattern(3, 10<<10)}, PublishOptions{
		Tag: "main", Push: push.Options{Params: smallParams},
		Check: func(x *layout.Index) error { checked = x; return bad },
	})
	if !errors.Is(err, bad) || !strings.HasPrefix(err.Error(), "not tagged: ") {
		t.Fatalf("err = %v", err)
	}
	if checked == nil || checked.Len() == 0 {
		t.Fatalf("check saw index %+v", checked)
	}
	tags, err := oci.ListTags(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	if len(tags) != 0 {
		t.Fatalf("a version that failed its check has tags %v", tags)
	}
}

func TestPublishWithoutTagsGivesOnlyTheProtectiveTag(t *testing.T) {
	tg := openLayout(t)
	// No tag at all: only the protective tag.
	p, err := publishTree(t, tg, map[string][]byte{"a": testutil.Pattern(4, 10<<10)}, PublishOptions{Push: push.Options{Params: smallParams}})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Tags) != 1 {
		t.Fatalf("tags %v", p.Tags)
	}
	if _, _, ok := oci.ParseProtectiveTag(p.Tags[0]); !ok {
		t.Fatalf("tag %q is not protective", p.Tags[0])
	}
}
