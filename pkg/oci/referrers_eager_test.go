package oci

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// overlapRecorder holds a referrers API answer until a tag-schema request
// arrives (or a bound passes, so that a client asking one after the other
// goes on) and records whether one came while it was held; it logs every
// request.
type overlapRecorder struct {
	next       http.Handler
	mu         sync.Mutex
	reqs       []string
	tagArrived chan struct{}
	overlapped bool
}

func newOverlapRecorder(next http.Handler) *overlapRecorder {
	return &overlapRecorder{next: next, tagArrived: make(chan struct{}, 16)}
}

func (o *overlapRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	o.reqs = append(o.reqs, r.Method+" "+r.URL.Path)
	o.mu.Unlock()
	switch {
	case strings.Contains(r.URL.Path, "/referrers/"):
		select {
		case <-o.tagArrived:
			o.mu.Lock()
			o.overlapped = true
			o.mu.Unlock()
		case <-time.After(2 * time.Second):
		}
	case strings.Contains(r.URL.Path, "/manifests/sha256-"):
		o.tagArrived <- struct{}{}
	}
	o.next.ServeHTTP(w, r)
}

func (o *overlapRecorder) take() ([]string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, ov := o.reqs, o.overlapped
	o.reqs, o.overlapped = nil, false
	for len(o.tagArrived) > 0 {
		<-o.tagArrived
	}
	return r, ov
}

// TestEagerReferrers: with WithEagerReferrers, a first listing of
// referrers asks the tag schema while the referrers API's answer is still
// to come (the two are not one after the other), and lists the same
// referrers as a plain listing, from a registry with the API and from one
// without; once the registry's answer is known, a listing asks only the
// way it serves.
func TestEagerReferrers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		h    http.Handler
		api  bool
	}{
		{"api", ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithReferrersSupport(true)), true},
		{"no-api", quietRegistry(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newOverlapRecorder(tc.h)
			srv := httptest.NewServer(rec)
			defer srv.Close()
			ref, err := ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/r:v1")
			if err != nil {
				t.Fatal(err)
			}
			open := func() Target {
				tg, err := Open(ctx, ref, Options{})
				if err != nil {
					t.Fatal(err)
				}
				return tg
			}
			tg := open()
			subject := pushSubjectManifest(t, tg, nil, "subject")
			pushSubjectManifest(t, tg, &subject, "one")
			pushSubjectManifest(t, tg, &subject, "two")
			want, err := Referrers(ctx, open(), subject, ocispec.MediaTypeEmptyJSON)
			if err != nil || len(want) != 2 {
				t.Fatalf("plain listing: %v, %v; want two referrers", want, err)
			}
			rec.take()

			eagerTg := open()
			got, err := Referrers(WithEagerReferrers(ctx), eagerTg, subject, ocispec.MediaTypeEmptyJSON)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("eager listing: %v, %v; want %v", got, err, want)
			}
			reqs, overlapped := rec.take()
			if !overlapped {
				t.Errorf("the eager listing asked %q, the tag schema only once the referrers API answered; want both at once", reqs)
			}
			if got, err := Referrers(WithEagerReferrers(ctx), eagerTg, subject, "none such"); err != nil || len(got) != 0 {
				t.Fatalf("eager listing of another type: %v, %v; want none", got, err)
			}
			reqs, _ = rec.take()
			for _, r := range reqs {
				if tc.api == strings.Contains(r, "/manifests/sha256-") {
					t.Errorf("a listing once the registry's answer was known asked %s (API served: %v)", r, tc.api)
				}
			}
		})
	}

	// Pages of the API are followed as a plain listing follows them.
	subject := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("subject"), Size: 2}
	page := func(i int) ([]ocispec.Descriptor, string) {
		var ds []ocispec.Descriptor
		for k := range 3 {
			ds = append(ds, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: "a", Digest: digest.FromString(fmt.Sprintf("%d/%d", i, k)), Size: 100})
		}
		if i == 2 {
			return ds, ""
		}
		return ds, fmt.Sprintf("page=%d", i+1)
	}
	want, err := Referrers(ctx, openPaging(t, &pagingRegistry{referrers: page}), subject, "a")
	if err != nil || len(want) != 9 {
		t.Fatalf("plain paged listing: %d, %v; want 9", len(want), err)
	}
	got, err := Referrers(WithEagerReferrers(ctx), openPaging(t, &pagingRegistry{referrers: page}), subject, "a")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("eager paged listing: %d, %v; want the plain listing's %d", len(got), err, len(want))
	}
}
