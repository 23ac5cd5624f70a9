package ociarchive

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

var _ oci.Batcher = (*Writer)(nil)

// Update leaves index.json with the tags and manifests one Push per
// manifest and one Tag per tag would (a tag moved, a tag given twice, manifests listed untagged), and a
// cancelled context changes nothing.
func TestWriterUpdateIsTagByTag(t *testing.T) {
	ctx := context.Background()
	var ms []ocispec.Descriptor
	var bs [][]byte
	for i := range 3 {
		m, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
			Config: ocispec.DescriptorEmptyJSON, Layers: []ocispec.Descriptor{}, Annotations: map[string]string{"i": fmt.Sprint(i)}})
		ms = append(ms, content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, m))
		bs = append(bs, m)
	}
	reqs := []oci.TagRequest{{Desc: ms[0], Tag: "a"}, {Desc: ms[1], Tag: "b"}, {Desc: ms[0], Tag: "c"}, {Desc: ms[1], Tag: "a"}}
	open := func() *Writer {
		w, err := Create(filepath.Join(t.TempDir(), "a.tar"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Abort)
		// One manifest pushed and tagged before, as a copy of several sources does.
		if err := w.Push(ctx, ms[2], bytes.NewReader(bs[2])); err != nil {
			t.Fatal(err)
		}
		if err := w.Tag(ctx, ms[2], "b"); err != nil {
			t.Fatal(err)
		}
		return w
	}
	seq, batch := open(), open()
	for i := range 2 {
		if err := seq.Push(ctx, ms[i], bytes.NewReader(bs[i])); err != nil {
			t.Fatal(err)
		}
		if err := batch.Store(ctx, ms[i], bytes.NewReader(bs[i])); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range reqs {
		if err := seq.Tag(ctx, r.Desc, r.Tag); err != nil {
			t.Fatal(err)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	before, _ := json.Marshal(batch.index)
	if err := batch.Update(cancelled, ms[:2], reqs); !errors.Is(err, context.Canceled) {
		t.Fatalf("Update with a cancelled context: %v", err)
	}
	if after, _ := json.Marshal(batch.index); !bytes.Equal(before, after) {
		t.Fatalf("a cancelled Update changed index.json:\n%s\n%s", before, after)
	}
	if err := batch.Update(ctx, ms[:2], reqs); err != nil {
		t.Fatal(err)
	}
	if a, b := listing(seq.index), listing(batch.index); a != b {
		t.Errorf("index.json one tag at a time:\n%s\nby Update:\n%s", a, b)
	}
}

// listing returns what an index lists, sorted: each tag with its digest,
// and the digests listed.
func listing(idx ocispec.Index) string {
	var out []string
	for _, d := range idx.Manifests {
		out = append(out, d.Annotations[ocispec.AnnotationRefName]+"="+d.Digest.String(), "listed "+d.Digest.String())
	}
	slices.Sort(out)
	return strings.Join(slices.Compact(out), "\n")
}
