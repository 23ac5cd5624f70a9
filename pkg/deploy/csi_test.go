package deploy

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// k8sManifests holds bdnvol CSI volumes in the shapes Kubernetes has them,
// next to ref: and volumeHandle keys that are not bdnvol references.
const k8sManifests = `apiVersion: apps/v1
kind: Deployment
metadata: {name: llama}
spec:
  template:
    spec:
      containers:
        - name: server
          image: reg.example/app:v1
      volumes:
        - name: weights
          csi:
            driver: csi.bdnvol.dev
            readOnly: true
            volumeAttributes:
              ref: reg.example/llama:prod   # line 16
              prefetch: headers
            nodePublishSecretRef: {name: registry-creds}
        - name: other-driver
          csi:
            driver: csi.example.com
            volumeAttributes: {ref: reg.example/llama:prod}
        - name: git
          gitRepo: {ref: reg.example/llama:v1}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: llama-sts}
spec:
  template:
    spec:
      volumes:
        - {name: w, csi: {driver: "csi.bdnvol.dev", volumeAttributes: {ref: "reg.example/llama:v1"}}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: llama-v1}
spec:
  accessModes: [ReadOnlyMany]
  capacity: {storage: 1Gi}
  csi:
    driver: csi.bdnvol.dev
    volumeHandle: 'reg.example/llama:prod'   # line 43
    readOnly: true
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: llama-attr}
spec:
  csi:
    driver: csi.bdnvol.dev
    volumeHandle: llama-attr-pv              # an ID: ref is the reference
    volumeAttributes:
      ref: reg.example/llama:v1               # line 54
---
{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
   "spec": {"volumes": [{"name": "w", "csi": {"driver": "csi.bdnvol.dev",
     "volumeAttributes": {"ref": "reg.example/llama:prod", "prefetch": "all"}}}]}}
]}
`

func TestFindCSIVolumes(t *testing.T) {
	cands, err := Find([]byte(k8sManifests), false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cands {
		if !c.Source || c.Offset < 0 {
			t.Errorf("candidate %+v: want a source located in the text", c)
		}
		got = append(got, fmt.Sprintf("%d:%s", c.Line, c.Value))
	}
	want := "[16:reg.example/llama:prod 33:reg.example/llama:v1 43:reg.example/llama:prod 54:reg.example/llama:v1 59:reg.example/llama:prod]"
	if fmt.Sprint(got) != want {
		t.Fatalf("found %v\nwant  %v", got, want)
	}
}

func TestPinCSIVolumes(t *testing.T) {
	ctx := context.Background()
	out, changes, err := Pin(ctx, []byte(k8sManifests), newFake(), PinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	prod, v1 := "reg.example/llama:prod@"+dProd.String(), "reg.example/llama:v1@"+dOld.String()
	want := strings.NewReplacer(
		"ref: reg.example/llama:prod   # line 16", "ref: "+prod+"   # line 16",
		`ref: "reg.example/llama:v1"`, `ref: "`+v1+`"`,
		"volumeHandle: 'reg.example/llama:prod'", "volumeHandle: '"+prod+"'",
		"ref: reg.example/llama:v1               # line 54", "ref: "+v1+"               # line 54",
		`"ref": "reg.example/llama:prod"`, `"ref": "`+prod+`"`,
	).Replace(k8sManifests)
	if string(out) != want {
		t.Fatalf("pinned manifests differ:\n--- got\n%s\n--- want\n%s", out, want)
	}
	if len(changes) != 5 {
		t.Fatalf("changes: %+v", changes)
	}
	// The other driver's ref and the gitRepo ref are untouched.
	if !strings.Contains(string(out), "{ref: reg.example/llama:prod}") || !strings.Contains(string(out), "gitRepo: {ref: reg.example/llama:v1}") {
		t.Fatalf("pinned a ref: that is not a bdnvol CSI volume's:\n%s", out)
	}
	f, err := Lint(ctx, out, newFake(), LintOptions{})
	if err != nil || len(f) != 0 {
		t.Fatalf("lint after pin: %v %+v", err, f)
	}
	f, err = Lint(ctx, []byte(k8sManifests), newFake(), LintOptions{})
	if err != nil || len(f) != 5 || !strings.Contains(f[2].Reason, "not pinned") || f[2].Line != 43 {
		t.Fatalf("lint before pin: %v %+v", err, f)
	}
}

func TestLintCSIVolumeHandle(t *testing.T) {
	in := "kind: PersistentVolume\nspec:\n  csi:\n    driver: csi.bdnvol.dev\n    volumeHandle: llama-pv\n"
	f, err := Lint(context.Background(), []byte(in), newFake(), LintOptions{})
	if err != nil || len(f) != 1 || f[0].Line != 5 || !strings.Contains(f[0].Reason, "invalid reference") {
		t.Fatalf("a bdnvol PV whose handle is not a reference: %v %+v", err, f)
	}
	_, _, err = Pin(context.Background(), []byte(in), newFake(), PinOptions{})
	if err == nil || !strings.Contains(err.Error(), "line 5: llama-pv") {
		t.Fatalf("pin: %v", err)
	}
	// A driver that is not a string, or a csi: key that is not a volume source.
	for _, in := range []string{
		"csi:\n  driver: [csi.bdnvol.dev]\n  volumeHandle: reg.example/llama:prod\n",
		"csi: csi.bdnvol.dev\nvolumeHandle: reg.example/llama:prod\n",
		"spec:\n  driver: csi.bdnvol.dev\n  volumeHandle: reg.example/llama:prod\n",
	} {
		if c, err := Find([]byte(in), false); err != nil || len(c) != 0 {
			t.Errorf("Find(%q) = %+v, %v; want nothing", in, c, err)
		}
	}
}
