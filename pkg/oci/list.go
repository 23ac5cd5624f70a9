package oci

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
)

// Bounds of the tag and referrer listings. A registry pages a listing
// and names the next page itself (a Link header); one that offers pages
// for ever, or very large pages, stops a listing at these bounds with an
// error wrapping ErrListTooLong, and one that offers a page it already
// served stops it with an error wrapping ErrRepeatedPage.
const (
	// MaxTags bounds the tags ListTags and EachTag read of one repository.
	MaxTags = 1_000_000
	// MaxTagBytes bounds the bytes of those tags together.
	MaxTagBytes = 64 << 20
	// MaxTagPages bounds the pages of one tag listing.
	MaxTagPages = 20_000
	// MaxReferrers bounds the referrers Referrers and EachReferrer read of
	// one manifest.
	MaxReferrers = 10_000
	// MaxReferrerBytes bounds the bytes of those referrers' descriptors
	// (media types, digests, annotations) together.
	MaxReferrerBytes = 16 << 20
	// MaxReferrerPages bounds the pages of one referrer listing.
	MaxReferrerPages = 1_000
)

// The tag bounds in force: the defaults above (tests lower them).
var maxTags, maxTagBytes, maxTagPages = MaxTags, MaxTagBytes, MaxTagPages

// ErrListTooLong is wrapped when a tag or referrer listing passes one of
// its bounds.
var ErrListTooLong = errors.New("listing too long")

// ErrRepeatedPage is wrapped when a registry offers a page of a listing it
// has already served (the same next-page link, or the same entries).
var ErrRepeatedPage = errors.New("registry repeated a page of a listing")

// StopListing, returned by the function EachTag or EachReferrer calls,
// ends the listing early; the listing then returns nil. No further page
// is asked for.
var StopListing = errors.New("stop listing")

// listGuardKey is the context key of the listGuard of one listing.
type listGuardKey struct{}

// listGuard counts the pages of one listing and refuses a page asked for
// twice (the registry's next-page link repeating one it gave) and the page
// past the bound. It keeps the hash of each URL, not the URL.
type listGuard struct {
	what     string
	maxPages int

	mu    sync.Mutex
	pages int
	urls  map[[32]byte]bool
	// bodies are the hashes of the non-empty pages seen, by the listing's
	// page function: a page of the same entries under a fresh link is a
	// repeat too.
	bodies map[[32]byte]bool
}

func newListGuard(what string, maxPages int) *listGuard {
	return &listGuard{what: what, maxPages: maxPages, urls: map[[32]byte]bool{}, bodies: map[[32]byte]bool{}}
}

// with returns ctx carrying g, for the requests of the listing.
func (g *listGuard) with(ctx context.Context) context.Context {
	return context.WithValue(ctx, listGuardKey{}, g)
}

// admit lets a request of the listing, to u, go out: it is refused past
// the page bound and when u was already answered.
func (g *listGuard) admit(u string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pages >= g.maxPages {
		return fmt.Errorf("%s: %w: more than %d pages", g.what, ErrListTooLong, g.maxPages)
	}
	if g.urls[sha256.Sum256([]byte(u))] {
		return fmt.Errorf("%s: %w: page %d links to a page already read", g.what, ErrRepeatedPage, g.pages)
	}
	return nil
}

// answered records a page answered from u.
func (g *listGuard) answered(u string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pages++
	g.urls[sha256.Sum256([]byte(u))] = true
}

// page admits a page of entries whose hash is h (nothing for an empty page).
func (g *listGuard) page(h [32]byte) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.bodies[h] {
		return fmt.Errorf("%s: %w: page %d lists the entries of an earlier page", g.what, ErrRepeatedPage, g.pages)
	}
	g.bodies[h] = true
	return nil
}

// listGuardTransport is the outer transport of registry clients: a page
// request of a listing (a GET of a tag list or of referrers whose context
// carries a listGuard) goes out only if the guard admits it, and counts
// once answered. An authentication challenge (401), which the client
// answers by sending the request again, is not a page.
type listGuardTransport struct{ next http.RoundTripper }

// RoundTrip sends req unless the listing it belongs to refuses it.
func (t listGuardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	g, ok := req.Context().Value(listGuardKey{}).(*listGuard)
	if !ok || req.Method != http.MethodGet || !isListingPath(req.URL.Path) {
		return t.next.RoundTrip(req)
	}
	u := req.URL.String()
	if err := g.admit(u); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp.StatusCode != http.StatusUnauthorized {
		g.answered(u)
	}
	return resp, err
}

// isListingPath tells the paths of the distribution API's tag list and
// referrers routes.
func isListingPath(p string) bool {
	return strings.HasPrefix(p, "/v2/") && (strings.HasSuffix(p, "/tags/list") || strings.Contains(p, "/referrers/"))
}

// pageHash is the hash of a page's entries, each length-prefixed.
func pageHash(entries []string) [32]byte {
	h := sha256.New()
	var n [8]byte
	for _, e := range entries {
		l := len(e)
		for i := range n {
			n[i] = byte(l >> (8 * i))
		}
		h.Write(n[:])
		h.Write([]byte(e))
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}
