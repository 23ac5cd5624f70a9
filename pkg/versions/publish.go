package versions

import (
	"context"
	"fmt"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// PublishOptions configure Publish.
type PublishOptions struct {
	// Tag is the tag the destination reference names ("" when none); its
	// version's chunking is the first guess for the new one.
	Tag string
	// Extra are more tags to point at the version.
	Extra []string
	// Push configures sealing and uploading. Zero Params mean: the
	// chunking of the version Tag points at, else of the newest sealed
	// version of the repository (so the new one dedups against it), else
	// layout.DefaultParams.
	Push push.Options
	// Check, when set, runs after sealing and before any tag moves; its
	// error leaves the version untagged.
	Check func(*layout.Index) error
	// Now is the time of the protective tag and the tag moves; zero means
	// time.Now().
	Now time.Time
	// Delta lets chunks be stored as deltas against a base version: Base
	// (a tag or digest of the repository) when set, else the version Tag
	// points at, else the newest sealed version. Without a base version
	// every chunk is stored plain.
	Delta bool
	Base  string
	// LocalBase, when set and Push.DeltaBaseDir is not, returns a local
	// copy of the base version of digest d (nil: none known).
	LocalBase func(d digest.Digest) push.Source
}

// Published is what Publish sealed and tagged.
type Published struct {
	*push.Result
	// Tags are the protective tag first, then Tag and Extra.
	Tags []string
}

// Publish seals src into t, gives the version its protective tag, points
// Tag and Extra at it, and records those moves in the tag history. Errors
// of Check read "not tagged: …"; an error recording the history, after
// the tags moved, reads "tagged, but recording the tag history failed: …".
func Publish(ctx context.Context, t oci.Target, src push.Source, opt PublishOptions) (*Published, error) {
	if opt.Push.Params == (layout.Params{}) {
		opt.Push.Params = PreviousParams(ctx, t, opt.Tag)
	}
	if opt.Check != nil {
		opt.Push.Destination = "" // Check needs the whole index, which reused pieces are not in
	}
	if opt.Delta && opt.Push.DeltaBase == nil {
		base, err := deltaBase(ctx, t, opt.Tag, opt.Base)
		if err != nil {
			return nil, err
		}
		if base != nil {
			opt.Push.DeltaBase = base.Index
			if opt.Push.DeltaBaseDir == nil && opt.LocalBase != nil {
				opt.Push.DeltaBaseDir = opt.LocalBase(base.Root.Digest)
			}
		}
	}
	res, err := push.Push(ctx, t, src, opt.Push)
	if err != nil {
		return nil, err
	}
	if opt.Check != nil {
		if err := opt.Check(res.Index); err != nil {
			return nil, fmt.Errorf("not tagged: %w", err)
		}
	}
	tags := opt.Extra
	if opt.Tag != "" {
		tags = append([]string{opt.Tag}, tags...)
	}
	prev := previousTargets(ctx, t, tags)
	now := opt.Now
	if now.IsZero() {
		now = time.Now()
	}
	prot, err := oci.TagVersion(ctx, t, res.Root, res.RootBytes, tags, now)
	if err != nil {
		return nil, err
	}
	if err := RecordPush(ctx, t, res.Root.Digest, tags, prev, now); err != nil {
		return nil, fmt.Errorf("tagged, but recording the tag history failed: %w", err)
	}
	return &Published{Result: res, Tags: append([]string{prot}, tags...)}, nil
}

// PreviousParams returns the chunking parameters of the version tag points
// at now, else of the newest sealed version of the repository (raised to
// a floor, so a version cut into tiny chunks does not pass them on), else
// layout.DefaultParams.
func PreviousParams(ctx context.Context, t oci.Target, tag string) layout.Params {
	candidates := []string{}
	if tag != "" {
		candidates = append(candidates, tag)
	}
	if newest := oci.NewestSealedTag(ctx, t); newest != "" {
		candidates = append(candidates, newest)
	}
	for _, c := range candidates {
		desc, err := t.Resolve(ctx, c)
		if err != nil {
			continue
		}
		if p, err := layout.ReadParams(ctx, t, desc); err == nil {
			return p
		}
	}
	return layout.DefaultParams
}

// previousTargets returns what each of tags points at before a publish
// moves it (absent when the tag is new), for the tag history.
func previousTargets(ctx context.Context, t oci.Target, tags []string) map[string]digest.Digest {
	prev := map[string]digest.Digest{}
	for _, tag := range tags {
		if d, err := t.Resolve(ctx, tag); err == nil {
			prev[tag] = d.Digest
		}
	}
	return prev
}

// DeltaBase opens the base version of a push with deltas: base (a tag or a
// digest of t) when not "", else the version tag points at, else the
// newest sealed version; nil when there is none (a first push). An
// explicit base that cannot be opened is an error.
func DeltaBase(ctx context.Context, t oci.Target, tag, base string) (*layout.Index, error) {
	v, err := deltaBase(ctx, t, tag, base)
	if v == nil {
		return nil, err
	}
	return v.Index, err
}

// deltaBase is DeltaBase, returning the version.
func deltaBase(ctx context.Context, t oci.Target, tag, base string) (*layout.Version, error) {
	candidates := []string{}
	switch {
	case base != "":
		candidates = append(candidates, base)
	default:
		if tag != "" {
			candidates = append(candidates, tag)
		}
		if newest := oci.NewestSealedTag(ctx, t); newest != "" {
			candidates = append(candidates, newest)
		}
	}
	for _, c := range candidates {
		desc, err := t.Resolve(ctx, c)
		if err == nil {
			var v *layout.Version
			if v, err = layout.OpenWith(ctx, t, desc, layout.OpenOptions{SkipEdges: true}); err == nil {
				return v, nil
			}
		}
		if base != "" {
			return nil, fmt.Errorf("delta base %s: %w", base, err)
		}
	}
	return nil, nil
}
