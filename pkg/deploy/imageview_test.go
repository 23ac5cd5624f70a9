package deploy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

var (
	dView1 = digest.FromString("image view of v1")
	dView2 = digest.FromString("image view of prod")
)

// viewResolver is fakeResolver that also knows two image views: of v1 and
// of prod.
type viewResolver struct{ *fakeResolver }

func newViewFake() *viewResolver {
	f := newFake()
	f.images["reg.example/llama-img:v1"] = true
	f.images["reg.example/llama-img:prod"] = true
	return &viewResolver{f}
}

func (v *viewResolver) Resolve(ctx context.Context, r oci.Ref) (digest.Digest, error) {
	if r.Digest == dView1 || r.Digest == dView2 {
		return "", fmt.Errorf("%s: %w", r, layout.ErrNotVolume)
	}
	return v.fakeResolver.Resolve(ctx, r)
}

func (v *viewResolver) ImageView(_ context.Context, r oci.Ref) (digest.Digest, digest.Digest, error) {
	views := map[string][2]digest.Digest{
		"reg.example/llama-img:v1": {dView1, dOld}, "reg.example/llama-img@" + dView1.String(): {dView1, dOld},
		"reg.example/llama-img:prod": {dView2, dProd}, "reg.example/llama-img@" + dView2.String(): {dView2, dProd},
	}
	key := r.Repo() + ":" + r.Tag
	if r.Digest != "" {
		key = r.Repo() + "@" + r.Digest.String()
	}
	if x, ok := views[key]; ok {
		return x[0], x[1], nil
	}
	return "", "", fmt.Errorf("%s: %w", r, ErrNotImageView)
}

func podWithView(view string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: llama}
spec:
  containers:
    - name: server
      image: reg.example/app:v1
  volumes:
    - name: weights
      csi:
        driver: csi.bdnvol.dev
        volumeAttributes:
          ref: reg.example/llama:prod@` + dProd.String() + `
    - name: weights-image
      image:
        reference: ` + view + `
`
}

func TestPinImageView(t *testing.T) {
	b := []byte(podWithView("reg.example/llama-img:prod"))
	out, changes, err := Pin(context.Background(), b, newViewFake(), PinOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	want := "reference: reg.example/llama-img:prod@" + dView2.String()
	if len(changes) != 1 || !strings.Contains(string(out), want) {
		t.Fatalf("changes %v; want the image view pinned (%s):\n%s", changes, want, out)
	}
	// Without image views the resolver leaves it alone.
	out, changes, err = Pin(context.Background(), b, newFake(), PinOptions{All: true})
	if err != nil || len(changes) != 0 || string(out) != string(b) {
		t.Fatalf("plain resolver: changes %v, err %v", changes, err)
	}
}

func TestLintImageViewOfAnotherVersion(t *testing.T) {
	res := newViewFake()
	// The view of v1 next to the volume pinned at prod: out of step.
	fs, err := Lint(context.Background(), []byte(podWithView("reg.example/llama-img:v1@"+dView1.String())), res, LintOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 || fs[0].Line != 16 || !strings.Contains(fs[0].Reason, "image view of reg.example/llama@"+dOld.String()) ||
		!strings.Contains(fs[0].Reason, "pins reg.example/llama@"+dProd.String()) {
		t.Fatalf("findings %+v: want one mismatch on line 16", fs)
	}
	// The view of prod: nothing to report.
	fs, err = Lint(context.Background(), []byte(podWithView("reg.example/llama-img:prod@"+dView2.String())), res, LintOptions{All: true})
	if err != nil || len(fs) != 0 {
		t.Fatalf("findings %+v, err %v: want none", fs, err)
	}
	// An unpinned view is reported like an unpinned volume.
	fs, err = Lint(context.Background(), []byte(podWithView("reg.example/llama-img:prod")), res, LintOptions{All: true})
	if err != nil || len(fs) != 1 || !strings.Contains(fs[0].Reason, "not pinned") {
		t.Fatalf("findings %+v, err %v: want not pinned", fs, err)
	}
}
