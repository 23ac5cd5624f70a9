package deploy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

var (
	dProd = digest.FromString("prod")
	dOld  = digest.FromString("old")
	dImg  = digest.FromString("image")
)

// fakeResolver knows tags and digests of volume repositories by name.
type fakeResolver struct {
	tags    map[string]digest.Digest // "repo:tag"
	digests map[digest.Digest]bool   // existing volume digests
	images  map[string]bool          // "repo:tag" of non-volumes
	calls   int
}

func newFake() *fakeResolver {
	return &fakeResolver{
		tags:    map[string]digest.Digest{"reg.example/llama:prod": dProd, "reg.example/llama:v1": dOld},
		digests: map[digest.Digest]bool{dProd: true, dOld: true},
		images:  map[string]bool{"reg.example/app:v1": true},
	}
}

func (f *fakeResolver) Resolve(_ context.Context, r oci.Ref) (digest.Digest, error) {
	f.calls++
	if r.Digest != "" {
		if f.digests[r.Digest] {
			return r.Digest, nil
		}
		if r.Digest == dImg {
			return "", layout.ErrNotVolume
		}
		return "", fmt.Errorf("%s: %w", r, oci.ErrNotFound)
	}
	key := r.Repo() + ":" + r.Tag
	if f.images[key] {
		return "", fmt.Errorf("%s: %w", r, layout.ErrNotVolume)
	}
	if d, ok := f.tags[key]; ok {
		return d, nil
	}
	return "", fmt.Errorf("%s: %w", r, oci.ErrNotFound)
}

func (f *fakeResolver) HasVolumes(_ context.Context, r oci.Ref) (bool, error) {
	return r.Repo() == "reg.example/llama", nil
}

const deployment = `# Deployment of the llama server.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: llama   # keep in sync with the service
  annotations:
    note: "données: reg.example/llama:v1"   # not a reference: has a space
spec:
  template:
    spec:
      containers:
        - name: server
          image: reg.example/app:v1      # an image, not a volume
          args: [--model, /models/llama]
      volumes:
        - name: weights
          image:
            reference: reg.example/llama:prod   # pinned by bdnvol pin --all
            pullPolicy: IfNotPresent
        - name: old
          image: {reference: 'reg.example/llama:v1', pullPolicy: Always}
---
# second document
mounts:
  - source: &w "reg.example/llama:prod"
    path: /models/llama
    readOnly: true
  - {source: reg.example/llama@` + "sha256:00" + `, path: /x}
`

func TestPinAllRoundTrip(t *testing.T) {
	ctx := context.Background()
	in := strings.Replace(deployment, "reg.example/llama@sha256:00", "reg.example/llama@"+dOld.String(), 1)
	out, changes, err := Pin(ctx, []byte(in), newFake(), PinOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.NewReplacer(
		"reference: reg.example/llama:prod ", "reference: reg.example/llama:prod@"+dProd.String()+" ",
		"'reg.example/llama:v1'", "'reg.example/llama:v1@"+dOld.String()+"'",
		`&w "reg.example/llama:prod"`, `&w "reg.example/llama:prod@`+dProd.String()+`"`,
	).Replace(in)
	if string(out) != want {
		t.Fatalf("pinned file differs:\n--- got\n%s\n--- want\n%s", out, want)
	}
	if len(changes) != 3 || changes[0].Line != 18 || changes[1].Line != 21 || changes[2].Line != 25 {
		t.Fatalf("changes: %+v", changes)
	}
	// Pinning again changes nothing, and lint is clean.
	again, ch2, err := Pin(ctx, out, newFake(), PinOptions{All: true})
	if err != nil || string(again) != string(out) || len(ch2) != 0 {
		t.Fatalf("second pin: %v %+v", err, ch2)
	}
	f, err := Lint(ctx, out, newFake(), LintOptions{All: true})
	if err != nil || len(f) != 0 {
		t.Fatalf("lint after pin: %v %+v", err, f)
	}
}

func TestPinSourceOnly(t *testing.T) {
	in := "mounts:\n- source: reg.example/llama:prod # weights\n  path: /m\nother: reg.example/llama:v1\n"
	out, changes, err := Pin(context.Background(), []byte(in), newFake(), PinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := "mounts:\n- source: reg.example/llama:prod@" + dProd.String() + " # weights\n  path: /m\nother: reg.example/llama:v1\n"
	if string(out) != want || len(changes) != 1 {
		t.Fatalf("got\n%s\nchanges %+v", out, changes)
	}
}

func TestPinJSON(t *testing.T) {
	in := "{\n  \"mounts\": [\n    {\"source\": \"reg.example/llama:prod\", \"path\": \"/m\", \"readOnly\": true}\n  ]\n}\n"
	out, _, err := Pin(context.Background(), []byte(in), newFake(), PinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(in, "llama:prod", "llama:prod@"+dProd.String(), 1)
	if string(out) != want {
		t.Fatalf("got\n%s", out)
	}
}

func TestPinErrors(t *testing.T) {
	in := "mounts:\n- source: reg.example/llama:gone\n  path: /a\n- source: reg.example/app:v1\n  path: /b\n- source: |-\n    reg.example/llama:prod\n  path: /c\n"
	out, changes, err := Pin(context.Background(), []byte(in), newFake(), PinOptions{})
	var re *RefError
	if !errors.As(err, &re) || !errors.Is(err, oci.ErrNotFound) || !errors.Is(err, layout.ErrNotVolume) || len(changes) != 0 || string(out) != in {
		t.Fatalf("pin: %v %+v\n%s", err, changes, out)
	}
	if !strings.Contains(err.Error(), "cannot rewrite") {
		t.Fatalf("block scalar not reported: %v", err)
	}
}

func TestPinUpdate(t *testing.T) {
	in := "mounts:\n- source: reg.example/llama:prod@" + dOld.String() + "\n  path: /m\n"
	out, _, err := Pin(context.Background(), []byte(in), newFake(), PinOptions{})
	if err != nil || string(out) != in {
		t.Fatalf("pin without --update rewrote a pinned reference: %v\n%s", err, out)
	}
	out, ch, err := Pin(context.Background(), []byte(in), newFake(), PinOptions{Update: true})
	want := "mounts:\n- source: reg.example/llama:prod@" + dProd.String() + "\n  path: /m\n"
	if err != nil || string(out) != want || len(ch) != 1 {
		t.Fatalf("pin --update: %v\n%s", err, out)
	}
}

func TestLintFindings(t *testing.T) {
	missing := digest.FromString("deleted")
	in := strings.Join([]string{
		"mounts:",
		"- source: reg.example/llama:prod", // 2: unpinned
		"  path: /a",
		"- source: reg.example/llama:prod@" + dOld.String(), // 4: moved
		"  path: /b",
		"- source: reg.example/llama@" + missing.String(), // 6: deleted
		"  path: /c",
		"- source: reg.example/llama:v1@" + dOld.String(), // 8: fine
		"  path: /d",
		"- source: reg.example/app:v1", // 10: not a volume
		"  path: /e",
		"- source: not a ref", // 12
		"  path: /f",
		"extra: reg.example/llama@" + missing.String(), // 14: only with --all, its repo holds volumes
		"img: reg.example/app:v1",                      // 15: an image, ignored with --all
		"",
	}, "\n")
	f, err := Lint(context.Background(), []byte(in), newFake(), LintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lines := func(f []Finding) []int {
		var out []int
		for _, x := range f {
			out = append(out, x.Line)
		}
		return out
	}
	if fmt.Sprint(lines(f)) != "[2 4 6 10 12]" {
		t.Fatalf("findings: %+v", f)
	}
	if !strings.Contains(f[1].Reason, "prod moved since this was pinned") || !strings.Contains(f[2].Reason, "does not exist") ||
		!strings.Contains(f[0].Reason, "not pinned") || !strings.Contains(f[3].Reason, "not a bdnvol volume") {
		t.Fatalf("reasons: %+v", f)
	}
	f, err = Lint(context.Background(), []byte(in), newFake(), LintOptions{All: true})
	if err != nil || fmt.Sprint(lines(f)) != "[2 4 6 10 12 14]" {
		t.Fatalf("findings with --all: %v %+v", err, f)
	}
}

func TestParseSpec(t *testing.T) {
	s, err := Parse([]byte("# weights\nmounts:\n  - source: reg.example/llama:prod\n    path: /models/llama\n    readOnly: true\n"))
	if err != nil || len(s.Mounts) != 1 || !s.Mounts[0].ReadOnly || s.Mounts[0].Path != "/models/llama" {
		t.Fatalf("%+v %v", s, err)
	}
	for _, bad := range []string{
		"",
		"mounts: []\n",
		"mounts:\n- {source: reg.example/llama:prod, path: models}\n",
		"mounts:\n- {source: reg.example/llama, path: /m}\n",
		"mounts:\n- {source: reg.example/llama:a, path: /m}\n- {source: reg.example/llama:b, path: /m}\n",
		"mounts:\n- {source: reg.example/llama:a, path: /m, readonly: true}\n",
	} {
		if _, err := Parse([]byte(bad)); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("Parse(%q): %v, want ErrInvalidSpec", bad, err)
		}
	}
}

func TestSpecTargets(t *testing.T) {
	s, err := Parse([]byte("mounts:\n  - source: r.example/a:v1\n    path: /models/a\n    readOnly: true\n  - source: oci:/l@sha256:" +
		strings.Repeat("0", 64) + "\n    path: /data\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := s.Targets("/root")
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0].Mountpoint != "/root/models/a" || ts[0].Path != "/models/a" || !ts[0].ReadOnly ||
		ts[0].Ref.Tag != "v1" || ts[1].Mountpoint != "/root/data" || ts[1].Ref.Layout != "/l" || ts[1].ReadOnly {
		t.Fatalf("targets %+v", ts)
	}
	nested, err := Parse([]byte("mounts:\n  - source: r.example/a:v1\n    path: /m\n  - source: r.example/b:v1\n    path: /m/inner\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nested.Targets("/root"); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "/root/m/inner is inside /root/m") {
		t.Errorf("nested mounts: %v", err)
	}
}
