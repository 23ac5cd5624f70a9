package replicate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/retention"
)

// pushBlob stores b in s.
func pushBlob(t *testing.T, s Side, mt string, b []byte) ocispec.Descriptor {
	t.Helper()
	d := content.NewDescriptorFromBytes(mt, b)
	if err := s.Target.Push(context.Background(), d, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	return d
}

// pushImage stores a manifest of the given layer bytes (each stored too)
// in s and tags it.
func pushLayers(t *testing.T, s Side, tag string, layers ...string) ocispec.Descriptor {
	t.Helper()
	cfg := pushBlob(t, s, ocispec.MediaTypeEmptyJSON, []byte("{}"))
	var ls []ocispec.Descriptor
	for _, l := range layers {
		ls = append(ls, pushBlob(t, s, "application/octet-stream", []byte(l)))
	}
	m, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cfg, Layers: ls})
	md := pushBlob(t, s, ocispec.MediaTypeImageManifest, m)
	if err := s.Target.Tag(context.Background(), md, tag); err != nil {
		t.Fatal(err)
	}
	return md
}

// newLayoutSide returns a fresh OCI layout.
func newLayoutSide(t *testing.T) Side {
	return side(t, "oci:"+filepath.Join(t.TempDir(), "l"))
}

// A signature tag replaces the destination's only with a manifest that
// keeps every signature the destination's held; otherwise the
// destination's stays and the tag is reported as kept.
func TestCopyKeepsTheDestinationsSignatures(t *testing.T) {
	ctx := context.Background()
	src, dst := newLayoutSide(t), newLayoutSide(t)
	v := pushLayers(t, src, "v1", "weights")
	pushLayers(t, dst, "v1", "weights")
	sig := "sha256-" + v.Digest.Encoded() + ".sig"
	theirs := pushLayers(t, dst, sig, "site signature")

	mine := pushLayers(t, src, sig, "another signature")
	rep, err := CopyAll(ctx, src, dst, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := dst.Target.Resolve(ctx, sig); d.Digest != theirs.Digest {
		t.Errorf("a signature manifest lacking the destination's signature replaced it")
	}
	if len(rep.Kept) != 1 || rep.Kept[0].Tag != sig || !strings.Contains(rep.Kept[0].Reason, "lacks") {
		t.Errorf("kept %+v, want %s", rep.Kept, sig)
	}

	both := pushLayers(t, src, sig, "site signature", "another signature")
	if _, err := CopyAll(ctx, src, dst, Options{}); err != nil {
		t.Fatal(err)
	}
	if d, _ := dst.Target.Resolve(ctx, sig); d.Digest != both.Digest {
		t.Errorf("a signature manifest holding the destination's signature and more was not moved (%s, mine %s)", d.Digest, mine.Digest)
	}
}

// tombstone stores the tombstone index of v in s under its deleted- tag
// (or under tag, when given).
func tombstone(t *testing.T, s Side, v ocispec.Descriptor, tag string) {
	t.Helper()
	idx, _ := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		ArtifactType: retention.ArtifactTypeTombstone, Manifests: []ocispec.Descriptor{v},
		Annotations: map[string]string{retention.AnnotationVersion: v.Digest.String()}})
	d := pushBlob(t, s, ocispec.MediaTypeImageIndex, idx)
	if tag == "" {
		tag = retention.DeletedTag(v.Digest, time.Unix(1e9, 0))
	}
	if err := s.Target.Tag(context.Background(), d, tag); err != nil {
		t.Fatal(err)
	}
}

// A tombstone tag is carried only for the version its tombstone holds, and
// not over a protective tag the destination keeps that version alive with;
// a protective tag must point at the version it names. Refused, the copy
// moves no tag.
func TestCopyRefusesForeignBookkeeping(t *testing.T) {
	ctx := context.Background()
	src := newLayoutSide(t)
	v := pushLayers(t, src, "v1", "weights")
	w := pushLayers(t, src, "w1", "other weights")
	tombstone(t, src, v, "")

	ok := newLayoutSide(t)
	if _, err := CopyAll(ctx, src, ok, Options{}); err != nil {
		t.Fatalf("a tombstone of a carried version: %v", err)
	}

	live := newLayoutSide(t)
	pushLayers(t, live, oci.ProtectiveTag(v.Digest, time.Unix(1e9, 0)), "weights")
	_, err := CopyAll(ctx, src, live, Options{})
	if !errors.Is(err, ErrForeignBookkeeping) || !strings.Contains(err.Error(), "keeps") {
		t.Errorf("a tombstone of a version the destination keeps: %v", err)
	}
	if _, err := live.Target.Resolve(ctx, "v1"); err == nil {
		t.Error("the refused copy tagged v1")
	}

	for name, forge := range map[string]func(s Side){
		"tombstone under another version's tag": func(s Side) { tombstone(t, s, v, retention.DeletedTag(w.Digest, time.Unix(2e9, 0))) },
		"protective tag of another version": func(s Side) {
			if err := s.Target.Tag(ctx, w, oci.ProtectiveTag(v.Digest, time.Unix(1e9, 0))); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newLayoutSide(t)
			pushLayers(t, s, "v1", "weights")
			pushLayers(t, s, "w1", "other weights")
			forge(s)
			dst := newLayoutSide(t)
			if _, err := CopyAll(ctx, s, dst, Options{}); !errors.Is(err, ErrForeignBookkeeping) {
				t.Errorf("copy: %v, want a refusal", err)
			}
			if tags, _ := oci.ListTags(ctx, dst.Target); len(tags) != 0 {
				t.Errorf("the refused copy tagged %v", tags)
			}
		})
	}
}
