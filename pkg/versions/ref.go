package versions

import (
	"context"
	"errors"
	"fmt"

	"oras.land/oras-go/v2/registry"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// ErrNoVersion is wrapped when a reference names a repository but no
// version (neither a tag nor a digest).
var ErrNoVersion = errors.New("name a tag or a digest")

// ErrNotRepository is wrapped when a reference that should name only a
// repository names a tag or a digest.
var ErrNotRepository = errors.New("takes a repository, without a tag or digest")

// ErrPushDigest is wrapped when the destination of a push names a digest.
var ErrPushDigest = errors.New("push takes a tag, not a digest")

// ErrBadTag is wrapped when a string is not a valid tag.
var ErrBadTag = errors.New("bad tag")

// ParseRef parses s, which must name a version: a tag or a digest.
func ParseRef(s string) (oci.Ref, error) {
	ref, err := oci.ParseRef(s)
	if err != nil {
		return ref, err
	}
	if ref.Reference() == "" {
		return ref, fmt.Errorf("%s: %w", s, ErrNoVersion)
	}
	return ref, nil
}

// ParseRepo parses s, which must name a repository only; verb (the
// command) is named in the error.
func ParseRepo(s, verb string) (oci.Ref, error) {
	ref, err := oci.ParseRef(s)
	if err != nil {
		return ref, err
	}
	if ref.Reference() != "" {
		return ref, fmt.Errorf("%s: %s %w", s, verb, ErrNotRepository)
	}
	return ref, nil
}

// ParsePushRef parses the destination of a push, HOST/REPO[:TAG] or
// oci:PATH[:TAG], and checks that neither its tag nor the extra tags are
// reserved (CheckTag).
func ParsePushRef(s string, extra []string) (oci.Ref, error) {
	ref, err := oci.ParseRef(s)
	if err != nil {
		return ref, err
	}
	if ref.Digest != "" {
		return ref, fmt.Errorf("%s: %w", s, ErrPushDigest)
	}
	for _, tag := range append([]string{ref.Tag}, extra...) {
		if err := CheckTag(tag); err != nil {
			return ref, err
		}
	}
	return ref, nil
}

// Open opens the repository of ref and resolves the version ref names.
func Open(ctx context.Context, ref oci.Ref, opt oci.Options) (oci.Target, *Root, error) {
	t, err := oci.Open(ctx, ref, opt)
	if err != nil {
		return nil, nil, err
	}
	root, err := Resolve(ctx, t, ref)
	return t, root, err
}

// CheckTags refuses a tag that is not a valid tag or that uses a reserved
// prefix, naming it.
func CheckTags(tags ...string) error {
	for _, tag := range tags {
		if err := (registry.Reference{Registry: "x", Repository: "x", Reference: tag}).ValidateReferenceAsTag(); err != nil {
			return fmt.Errorf("%w %q", ErrBadTag, tag)
		}
		if err := CheckTag(tag); err != nil {
			return err
		}
	}
	return nil
}

// PushParams returns the chunking parameters for a push to tag: p
// completed, or when p is all zero, those PreviousParams finds. The error
// is about p.
func PushParams(ctx context.Context, t oci.Target, tag string, p layout.Params) (layout.Params, error) {
	params, err := p.Completed()
	if err != nil {
		return params, err
	}
	if params == (layout.Params{}) {
		params = PreviousParams(ctx, t, tag)
	}
	return params, nil
}
