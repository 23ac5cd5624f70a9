package main

import (
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/retention"
)

func TestMountReferences(t *testing.T) {
	d := digest.FromString("v")
	got := mountReferences([]mounts.Serving{{Mountpoint: "/mnt/a", Reference: "reg.example/a:v1", Digest: d}})
	want := retention.Reference{Source: "/mnt/a", Ref: "reg.example/a:v1", Digest: d, Mount: true}
	if len(got) != 1 || got[0] != want {
		t.Errorf("references %+v, want [%+v]", got, want)
	}
	if got := mountReferences(nil); len(got) != 0 {
		t.Errorf("no mounts: %+v", got)
	}
}
