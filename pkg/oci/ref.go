package oci

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/registry"
)

// ErrInvalidRef is wrapped by every reference parse error.
var ErrInvalidRef = errors.New("invalid reference")

// LayoutPrefix starts a reference to an OCI image layout on local disk.
const LayoutPrefix = "oci:"

// Ref is a parsed volume reference: a repository in a registry or an OCI
// layout directory, with a tag, a digest, or both (the digest wins).
type Ref struct {
	Layout     string // absolute path of an OCI layout; empty for a registry
	Registry   string // host[:port]
	Repository string
	Tag        string
	Digest     digest.Digest
}

// ParseRef parses host[:port]/repo[:tag][@sha256:…] and
// oci:PATH[:tag][@sha256:…].
func ParseRef(s string) (Ref, error) {
	var r Ref
	rest := s
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		d, err := digest.Parse(rest[i+1:])
		if err != nil {
			return r, fmt.Errorf("%w %q: %v", ErrInvalidRef, s, err)
		}
		r.Digest, rest = d, rest[:i]
	}
	if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') && i >= 0 {
		if strings.HasPrefix(rest, LayoutPrefix) && i == len(LayoutPrefix)-1 {
			// "oci:path" without a tag
		} else {
			r.Tag, rest = rest[i+1:], rest[:i]
			if r.Tag == "" {
				return r, fmt.Errorf("%w %q: empty tag", ErrInvalidRef, s)
			}
		}
	}
	if r.Tag != "" {
		if err := (registry.Reference{Registry: "x", Repository: "x", Reference: r.Tag}).ValidateReferenceAsTag(); err != nil {
			return r, fmt.Errorf("%w %q: bad tag %q", ErrInvalidRef, s, r.Tag)
		}
	}
	if p, ok := strings.CutPrefix(rest, LayoutPrefix); ok {
		if p == "" {
			return r, fmt.Errorf("%w %q: empty layout path", ErrInvalidRef, s)
		}
		if strings.ContainsAny(p, ":@") {
			// They would read as a tag or digest separator.
			return r, fmt.Errorf("%w %q: a layout path may not contain ':' or '@'", ErrInvalidRef, s)
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return r, fmt.Errorf("%w %q: %v", ErrInvalidRef, s, err)
		}
		r.Layout = abs
		return r, nil
	}
	host, repo, ok := strings.Cut(rest, "/")
	if !ok || host == "" || repo == "" {
		return r, fmt.Errorf("%w %q: want HOST/REPO[:TAG][@DIGEST] or oci:PATH[:TAG]", ErrInvalidRef, s)
	}
	ref := registry.Reference{Registry: host, Repository: repo}
	if err := ref.ValidateRegistry(); err != nil {
		return r, fmt.Errorf("%w %q: bad registry %q", ErrInvalidRef, s, host)
	}
	if err := ref.ValidateRepository(); err != nil {
		return r, fmt.Errorf("%w %q: bad repository %q", ErrInvalidRef, s, repo)
	}
	r.Registry, r.Repository = host, repo
	return r, nil
}

// Repo names the repository: "host/repo" or "oci:/path".
func (r Ref) Repo() string {
	if r.Layout != "" {
		return LayoutPrefix + r.Layout
	}
	return r.Registry + "/" + r.Repository
}

// Reference returns the digest if there is one, else the tag.
func (r Ref) Reference() string {
	if r.Digest != "" {
		return r.Digest.String()
	}
	return r.Tag
}

// String formats the reference as it was given.
func (r Ref) String() string {
	s := r.Repo()
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest.String()
	}
	return s
}

// Pinned returns REPO@DIGEST for d.
func (r Ref) Pinned(d digest.Digest) string { return r.Repo() + "@" + d.String() }

// IsLoopback reports whether host (with an optional port) is a loopback
// address, which is reached over plain HTTP as docker does.
func IsLoopback(host string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.Trim(h, "[]")
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
