package versions

import (
	"fmt"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/source"
)

// A file is matched only under the same scope, with the same identifier at
// the same path, and when the previous version holds a file of the same
// size there; the record is left out when it would be too long.
func TestReuseUnchangedTrustsOnlyTheSameObject(t *testing.T) {
	dA, dB := digest.FromString("a"), digest.FromString("b")
	x := &layout.Index{Files: []layout.File{
		{Path: "a.bin", Type: layout.TypeFile, Mode: 0o644, Size: 10, Digest: dA},
		{Path: "b.bin", Type: layout.TypeFile, Mode: 0o644, Size: 20, Digest: dB},
	}}
	rec := &sourceRecord{Scope: "s3 b", Files: map[string]string{"a.bin": `etag="1"`, "b.bin": `etag="2"`, "c.bin": `etag="3"`}}
	entries := func() []push.Entry {
		return []push.Entry{
			{Path: "a.bin", Type: layout.TypeFile, Size: 10},
			{Path: "b.bin", Type: layout.TypeFile, Size: 21}, // grew: not b.bin of before
			{Path: "c.bin", Type: layout.TypeFile, Size: 5},  // not in the previous index
		}
	}
	ids := source.Identities{Scope: "s3 b", Files: map[string]string{"a.bin": `etag="1"`, "b.bin": `etag="2"`, "c.bin": `etag="3"`}}
	es := entries()
	if n := reuseUnchanged(es, ids, rec, x); n != 1 || es[0].Digest != dA || es[1].Digest != "" || es[2].Digest != "" {
		t.Errorf("matched %d: %+v; want a.bin only", n, es)
	}
	for name, ids := range map[string]source.Identities{
		"another scope":      {Scope: "s3 other", Files: ids.Files},
		"another identifier": {Scope: "s3 b", Files: map[string]string{"a.bin": `etag="9"`}},
		"no identifier":      {Scope: "s3 b"},
	} {
		if es := entries(); reuseUnchanged(es, ids, rec, x) != 0 || es[0].Digest != "" {
			t.Errorf("%s: a.bin matched", name)
		}
	}
	if reuseUnchanged(entries(), ids, nil, x) != 0 || reuseUnchanged(entries(), ids, rec, nil) != 0 {
		t.Error("matched without a previous record or index")
	}
	big := source.Identities{Scope: "s", Files: map[string]string{}}
	for i := range MaxSourceRecord / 20 { // each entry takes over 20 bytes
		big.Files[fmt.Sprintf("shard-%07d.bin", i)] = "etag"
	}
	if encodeRecord(big) != "" || encodeRecord(source.Identities{}) != "" || encodeRecord(ids) == "" {
		t.Error("encodeRecord: want none for a record over the bound or without scope, one for a small record")
	}
}
