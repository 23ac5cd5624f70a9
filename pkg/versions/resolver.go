package versions

import (
	"context"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Resolver resolves the references of deploy files (it is a
// deploy.Resolver), opening each repository once and resolving each
// reference once. It is not safe for concurrent use.
type Resolver struct {
	opt     oci.Options
	targets map[string]oci.Target
	digests map[string]resolved
	volumes map[string]bool
}

type resolved struct {
	d   digest.Digest
	err error
}

// NewResolver returns a Resolver that opens repositories with opt.
func NewResolver(opt oci.Options) *Resolver {
	return &Resolver{opt: opt, targets: map[string]oci.Target{}, digests: map[string]resolved{}, volumes: map[string]bool{}}
}

func (r *Resolver) target(ctx context.Context, ref oci.Ref) (oci.Target, error) {
	if t, ok := r.targets[ref.Repo()]; ok {
		return t, nil
	}
	t, err := oci.Open(ctx, ref, r.opt)
	if err != nil {
		return nil, err
	}
	r.targets[ref.Repo()] = t
	return t, nil
}

// Resolve returns the digest of the version ref names, as Resolve does.
func (r *Resolver) Resolve(ctx context.Context, ref oci.Ref) (digest.Digest, error) {
	key := ref.String()
	if v, ok := r.digests[key]; ok {
		return v.d, v.err
	}
	var v resolved
	t, err := r.target(ctx, ref)
	if err != nil {
		v.err = err
	} else if root, err := Resolve(ctx, t, ref); err != nil {
		v.err = err
	} else {
		v.d = root.Desc.Digest
	}
	r.digests[key] = v
	return v.d, v.err
}

// HasVolumes reports whether ref's repository holds sealed versions.
func (r *Resolver) HasVolumes(ctx context.Context, ref oci.Ref) (bool, error) {
	if v, ok := r.volumes[ref.Repo()]; ok {
		return v, nil
	}
	t, err := r.target(ctx, ref)
	if err != nil {
		return false, err
	}
	tags, err := oci.ListTags(ctx, t)
	if err != nil {
		return false, err
	}
	has := false
	for _, tag := range tags {
		if _, _, ok := oci.ParseProtectiveTag(tag); ok {
			has = true
			break
		}
	}
	r.volumes[ref.Repo()] = has
	return has, nil
}
