package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// pushSubjectManifest pushes an empty-config manifest, with subject if not nil.
func pushSubjectManifest(t *testing.T, tg Target, subject *ocispec.Descriptor, note string) ocispec.Descriptor {
	t.Helper()
	ctx := context.Background()
	if err := tg.Push(ctx, ocispec.DescriptorEmptyJSON, bytes.NewReader([]byte("{}"))); err != nil && !strings.Contains(err.Error(), "exists") {
		t.Fatal(err)
	}
	b, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: ocispec.DescriptorEmptyJSON, Layers: []ocispec.Descriptor{}, Subject: subject,
		Annotations: map[string]string{"note": note},
	})
	if err != nil {
		t.Fatal(err)
	}
	d := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, b)
	if err := tg.Push(ctx, d, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	return d
}

// ServesReferrers tells a registry with the referrers API from one
// without it and from a layout; once it said yes, a referrer pushed is
// not also indexed under the tag schema (the registry lists it itself).
func TestServesReferrers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		h    http.Handler
		want bool
	}{
		{"api", ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithReferrersSupport(true)), true},
		{"no-api", quietRegistry(), false}, // 404 METHOD_UNKNOWN
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.h)
			defer srv.Close()
			ref, err := ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/r:v1")
			if err != nil {
				t.Fatal(err)
			}
			tg, err := Open(ctx, ref, Options{})
			if err != nil {
				t.Fatal(err)
			}
			subject := pushSubjectManifest(t, tg, nil, "subject")
			got, err := ServesReferrers(ctx, tg, subject)
			if err != nil || got != tc.want {
				t.Fatalf("ServesReferrers = %v, %v; want %v", got, err, tc.want)
			}
			ref2 := pushSubjectManifest(t, tg, &subject, "referrer")
			fallback := subject.Digest.Algorithm().String() + "-" + subject.Digest.Encoded()
			_, err = tg.Resolve(ctx, fallback)
			if indexed := err == nil; indexed == tc.want {
				t.Fatalf("referrers tag %s exists: %v, want %v", fallback, indexed, !tc.want)
			}
			refs, err := Referrers(ctx, tg, subject, "")
			if err != nil || len(refs) != 1 || refs[0].Digest != ref2.Digest {
				t.Fatalf("referrers %v (%v), want %s", refs, err, ref2.Digest)
			}
		})
	}
	ref, err := ParseRef("oci:" + filepath.Join(t.TempDir(), "l") + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := Open(ctx, ref, Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ServesReferrers(ctx, tg, pushSubjectManifest(t, tg, nil, "s")); got || err != nil {
		t.Fatalf("layout: ServesReferrers = %v, %v", got, err)
	}
}
