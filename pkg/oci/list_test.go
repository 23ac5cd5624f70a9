package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
)

// serverPageCap ends the hostile listings below after this many pages, so
// that a listing without bounds ends too (with everything appended).
const serverPageCap = 5_000

// pagingRegistry speaks the tag list and referrers routes of the
// distribution API: tags(i) and referrers(i) give page i's entries and
// the query of the next page's link ("" for none). It counts the
// requests.
type pagingRegistry struct {
	tags      func(i int) ([]string, string)
	referrers func(i int) ([]ocispec.Descriptor, string)
	basicAuth bool // answer 401 with a Basic challenge to requests without credentials
	requests  atomic.Int64
}

func (p *pagingRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := r.BasicAuth(); p.basicAuth && !ok {
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	n := p.requests.Add(1)
	i, _ := strconv.Atoi(r.URL.Query().Get("page"))
	var next string
	var body any
	switch {
	case strings.HasSuffix(r.URL.Path, "/tags/list") && p.tags != nil:
		var tags []string
		tags, next = p.tags(i)
		body = map[string]any{"name": "vol/r", "tags": tags}
		w.Header().Set("Content-Type", "application/json")
	case strings.Contains(r.URL.Path, "/referrers/") && p.referrers != nil:
		var ds []ocispec.Descriptor
		ds, next = p.referrers(i)
		body = ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: ds}
		w.Header().Set("Content-Type", ocispec.MediaTypeImageIndex)
	default:
		http.NotFound(w, r)
		return
	}
	if next != "" && n < serverPageCap {
		w.Header().Set("Link", fmt.Sprintf(`<%s?%s>; rel="next"`, r.URL.Path, next))
	}
	json.NewEncoder(w).Encode(body)
}

// openPaging opens the repository vol/r of a pagingRegistry.
func openPaging(t *testing.T, p *pagingRegistry) Target {
	t.Helper()
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	ref, err := ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/r:v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := Open(context.Background(), ref, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// fresh returns n tags of page that no other page lists.
func fresh(page, n int) []string {
	out := make([]string, n)
	for k := range out {
		out[k] = fmt.Sprintf("t%07d-%03d", page, k)
	}
	return out
}

// TestListTagsBounded: a registry offering fresh pages for ever, pages
// of nothing for ever, the same link again, or the same page under fresh
// links is refused with ErrListTooLong or ErrRepeatedPage within the
// bounds; a caller that needs a few tags asks for the pages that hold
// them only.
func TestListTagsBounded(t *testing.T) {
	ctx := context.Background()
	// Bounds within the test server's cap of pages (the defaults are ten
	// times these): the same code, a smaller number.
	defer func(n, b, p int) { maxTags, maxTagBytes, maxTagPages = n, b, p }(maxTags, maxTagBytes, maxTagPages)
	maxTags, maxTagBytes, maxTagPages = 100_000, 16<<20, 2_000
	for _, tc := range []struct {
		name    string
		page    func(i int) ([]string, string)
		want    error
		maxReqs int64
	}{
		{"fresh pages", func(i int) ([]string, string) { return fresh(i, 100), fmt.Sprintf("page=%d", i+1) }, ErrListTooLong, int64(maxTags/100 + 1)},
		{"empty pages", func(i int) ([]string, string) { return nil, fmt.Sprintf("page=%d", i+1) }, ErrListTooLong, int64(maxTagPages)},
		{"same link", func(i int) ([]string, string) { return fresh(i, 10), "page=1" }, ErrRepeatedPage, 2},
		{"same page", func(i int) ([]string, string) { return fresh(0, 10), fmt.Sprintf("page=%d", i+1) }, ErrRepeatedPage, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pagingRegistry{tags: tc.page}
			tg := openPaging(t, p)
			tags, err := ListTags(ctx, tg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ListTags: %d tags, %v; want %v", len(tags), err, tc.want)
			}
			if got := p.requests.Load(); got > tc.maxReqs {
				t.Fatalf("%d pages asked for, want at most %d", got, tc.maxReqs)
			}
			if tags != nil {
				t.Fatalf("%d tags returned with the error", len(tags))
			}
		})
	}
	t.Run("behind a challenge", func(t *testing.T) {
		// Each page is asked for twice, first without credentials: a 401
		// is no page, and the second request no repeat.
		p := &pagingRegistry{basicAuth: true, tags: func(i int) ([]string, string) {
			if i == 4 {
				return fresh(i, 3), ""
			}
			return fresh(i, 3), fmt.Sprintf("page=%d", i+1)
		}}
		srv := httptest.NewServer(p)
		defer srv.Close()
		host := strings.TrimPrefix(srv.URL, "http://")
		store := credentials.NewMemoryStore()
		store.Put(ctx, host, auth.Credential{Username: "u", Password: "p"})
		ref, err := ParseRef(host + "/vol/r:v1")
		if err != nil {
			t.Fatal(err)
		}
		tg, err := Open(ctx, ref, Options{Credentials: store})
		if err != nil {
			t.Fatal(err)
		}
		tags, err := ListTags(ctx, tg)
		if err != nil || len(tags) != 15 {
			t.Fatalf("ListTags behind a challenge: %d tags, %v; want 15", len(tags), err)
		}
	})
	t.Run("stop early", func(t *testing.T) {
		p := &pagingRegistry{tags: func(i int) ([]string, string) { return fresh(i, 3), fmt.Sprintf("page=%d", i+1) }}
		tg := openPaging(t, p)
		var got []string
		err := EachTag(ctx, tg, func(tag string) error {
			got = append(got, tag)
			if len(got) == 4 {
				return StopListing
			}
			return nil
		})
		if err != nil || len(got) != 4 || p.requests.Load() != 2 {
			t.Fatalf("EachTag stopped at 4: %v, %v after %d pages; want 4 tags of 2 pages", got, err, p.requests.Load())
		}
	})
}

// TestReferrersBounded: the same bounds for referrers, including pages
// whose every entry the artifact-type filter drops (the page callback is
// then never called) and pages of nothing.
func TestReferrersBounded(t *testing.T) {
	ctx := context.Background()
	subject := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("subject"), Size: 2}
	refs := func(i, n int, at string) []ocispec.Descriptor {
		out := make([]ocispec.Descriptor, n)
		for k := range out {
			out[k] = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: at,
				Digest: digest.FromString(fmt.Sprintf("%d/%d", i, k)), Size: 100}
		}
		return out
	}
	next := func(i int) string { return fmt.Sprintf("page=%d", i+1) }
	for _, tc := range []struct {
		name    string
		page    func(i int) ([]ocispec.Descriptor, string)
		filter  string
		want    error
		maxReqs int64
	}{
		{"fresh pages", func(i int) ([]ocispec.Descriptor, string) { return refs(i, 10, "a"), next(i) }, "", ErrListTooLong, MaxReferrers/10 + 1},
		{"filtered out", func(i int) ([]ocispec.Descriptor, string) { return refs(i, 10, "other"), next(i) }, "wanted", ErrListTooLong, MaxReferrerPages},
		{"empty pages", func(i int) ([]ocispec.Descriptor, string) { return nil, next(i) }, "", ErrListTooLong, MaxReferrerPages},
		{"same link", func(i int) ([]ocispec.Descriptor, string) { return refs(i, 3, "a"), "page=1" }, "", ErrRepeatedPage, 2},
		{"same page", func(i int) ([]ocispec.Descriptor, string) { return refs(0, 3, "a"), next(i) }, "", ErrRepeatedPage, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pagingRegistry{referrers: tc.page}
			tg := openPaging(t, p)
			got, err := Referrers(ctx, tg, subject, tc.filter)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Referrers: %d, %v; want %v", len(got), err, tc.want)
			}
			if n := p.requests.Load(); n > tc.maxReqs {
				t.Fatalf("%d pages asked for, want at most %d", n, tc.maxReqs)
			}
		})
	}
	t.Run("stop early", func(t *testing.T) {
		p := &pagingRegistry{referrers: func(i int) ([]ocispec.Descriptor, string) { return refs(i, 5, "a"), next(i) }}
		tg := openPaging(t, p)
		n := 0
		err := EachReferrer(ctx, tg, subject, "", func(ocispec.Descriptor) error {
			if n++; n == 16 {
				return StopListing
			}
			return nil
		})
		if err != nil || n != 16 || p.requests.Load() != 4 {
			t.Fatalf("EachReferrer stopped at 16: %d, %v after %d pages; want 16 of 4 pages", n, err, p.requests.Load())
		}
	})
}
