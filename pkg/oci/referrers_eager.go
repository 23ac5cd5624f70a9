package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote/auth"
)

// eagerKey marks a context whose referrer listings ask both ways at once.
type eagerKey struct{}

// WithEagerReferrers returns ctx marked so that a listing of referrers
// (EachReferrer, Referrers) from a registry whose support of the referrers
// API is not known yet asks the API and the tag schema (the index tagged
// sha256-<hex>) at once, instead of the tag schema only once the API
// turned out missing: one round trip less where the API is missing, one
// request more where it is served. The referrers listed are the same.
func WithEagerReferrers(ctx context.Context) context.Context {
	return context.WithValue(ctx, eagerKey{}, true)
}

func eager(ctx context.Context) bool { v, _ := ctx.Value(eagerKey{}).(bool); return v }

// defaultMetadataBytes is oras-go's bound of a referrers index when the
// repository sets none.
const defaultMetadataBytes = 4 << 20

// Referrers lists the referrers of desc as the oras-go repository does
// (the API, else the tag schema, remembering which); with a context from
// WithEagerReferrers and the registry's support unknown, the tag schema is
// asked beside the API's first page and used when the API is missing.
func (r *repository) Referrers(ctx context.Context, desc ocispec.Descriptor, artifactType string, fn func([]ocispec.Descriptor) error) error {
	if !eager(ctx) || r.refsKnown.Load() {
		return r.Repository.Referrers(ctx, desc, artifactType, fn)
	}
	ctx = auth.AppendRepositoryScope(ctx, r.Reference, auth.ActionPull)
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type tagged struct {
		ds  []ocispec.Descriptor
		err error
	}
	tc := make(chan tagged, 1)
	go func() {
		ds, err := r.referrersByTag(tctx, desc)
		tc <- tagged{ds, err}
	}()
	u := fmt.Sprintf("%s/v2/%s/referrers/%s", r.base, r.Reference.Repository, desc.Digest)
	if artifactType != "" {
		u += "?artifactType=" + url.QueryEscape(artifactType)
	}
	page, next, served, err := r.referrersPage(ctx, u)
	if err != nil {
		// Not a plain answer either way: as oras-go would.
		cancel()
		return r.Repository.Referrers(ctx, desc, artifactType, fn)
	}
	if err := r.Repository.SetReferrersCapability(served); err != nil {
		// Decided meanwhile (a push): keep to that decision.
		cancel()
		return r.Repository.Referrers(ctx, desc, artifactType, fn)
	}
	r.refsKnown.Store(true)
	if !served {
		t := <-tc
		if errors.Is(t.err, errdef.ErrNotFound) {
			return nil
		}
		if t.err != nil {
			return t.err
		}
		if ds := filterReferrers(t.ds, artifactType); len(ds) > 0 {
			return fn(ds)
		}
		return nil
	}
	cancel()
	for {
		if ds := filterReferrers(page, artifactType); len(ds) > 0 {
			if err := fn(ds); err != nil {
				return err
			}
		}
		if next == "" {
			return nil
		}
		if page, next, served, err = r.referrersPage(ctx, next); err != nil {
			return err
		}
		if !served {
			return fmt.Errorf("referrers of %s: a further page is not an image index: %w", desc.Digest, errdef.ErrUnsupported)
		}
	}
}

// referrersPage GETs one page of the referrers API at u: its referrers and
// the next page's URL, served false for a registry that has no such API
// (a 404 without an error body naming the repository unknown, or an
// answer that is not an image index). Any other answer is an error.
func (r *repository) referrersPage(ctx context.Context, u string) (ds []ocispec.Descriptor, next string, served bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, "", false, err
	}
	req.Header.Set("Accept", ocispec.MediaTypeImageIndex)
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, "", false, err
	}
	defer drain(resp)
	limit := r.Repository.MaxMetadataBytes
	if limit <= 0 {
		limit = defaultMetadataBytes
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if strings.Contains(string(b), "NAME_UNKNOWN") {
			return nil, "", false, fmt.Errorf("referrers: %s", resp.Status)
		}
		return nil, "", false, nil
	default:
		return nil, "", false, answerError("referrers GET", resp)
	}
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct != ocispec.MediaTypeImageIndex {
		return nil, "", false, nil
	}
	var idx ocispec.Index
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, "", false, err
	}
	if int64(len(b)) > limit {
		return nil, "", false, fmt.Errorf("referrers: an index of more than %d bytes", limit)
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, "", false, fmt.Errorf("referrers: %w", err)
	}
	next, err = nextLink(resp)
	return idx.Manifests, next, true, err
}

// nextLink is the absolute URL of the page a Link header with rel="next"
// names; "" when there is none.
func nextLink(resp *http.Response) (string, error) {
	link := resp.Header.Get("Link")
	if link == "" {
		return "", nil
	}
	i, j := strings.Index(link, "<"), strings.Index(link, ">")
	if i != 0 || j < 0 || !strings.Contains(link[j:], `rel="next"`) {
		return "", fmt.Errorf("referrers: a Link header %q", link)
	}
	u, err := resp.Request.URL.Parse(link[1:j])
	if err != nil {
		return "", fmt.Errorf("referrers: a Link header %q: %w", link, err)
	}
	return u.String(), nil
}

// referrersByTag reads the tag-schema index of desc's referrers, verified
// and bounded as oras-go reads it.
func (r *repository) referrersByTag(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	if err := desc.Digest.Validate(); err != nil {
		return nil, err
	}
	tag := desc.Digest.Algorithm().String() + "-" + desc.Digest.Encoded()
	d, rc, err := r.Repository.FetchReference(ctx, tag)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	limit := r.Repository.MaxMetadataBytes
	if limit <= 0 {
		limit = defaultMetadataBytes
	}
	if d.Size > limit {
		return nil, fmt.Errorf("referrers index %s: %d bytes, more than %d", tag, d.Size, limit)
	}
	b, err := content.ReadAll(rc, d)
	if err != nil {
		return nil, fmt.Errorf("referrers index %s: %w", tag, err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("referrers index %s: %w", tag, err)
	}
	return idx.Manifests, nil
}

// filterReferrers keeps the referrers of artifactType ("": all), as oras-go
// filters them.
func filterReferrers(ds []ocispec.Descriptor, artifactType string) []ocispec.Descriptor {
	if artifactType == "" {
		return ds
	}
	var out []ocispec.Descriptor
	for _, d := range ds {
		if d.ArtifactType == artifactType {
			out = append(out, d)
		}
	}
	return out
}
