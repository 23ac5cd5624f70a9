package retention

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/beneath"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// Sources returns the references that are live right now. It is called
// again right before each deletion, so it should re-read what it can.
type Sources func(ctx context.Context) ([]Reference, error)

// refCheck returns an error wrapping ErrKept when refs or the human tags
// keep the version d under p.
func refCheck(ctx context.Context, src Sources, d digest.Digest, tags []string, p Policy) error {
	var refs []Reference
	if src != nil {
		var err error
		if refs, err = src(ctx); err != nil {
			return fmt.Errorf("re-reading references: %w", err)
		}
	}
	if rs := KeepReasons(versions.Version{Digest: d, Tags: tags}, refs, p); len(rs) > 0 {
		return fmt.Errorf("%w: %s", ErrKept, Decision{Reasons: rs}.Why())
	}
	return nil
}

// PurgeOptions configure Purge.
type PurgeOptions struct {
	// Sources are re-read right before the purge; a reference to the
	// version stops it.
	Sources Sources
}

// Purge deletes the tombstoned version rec for real: its warm-state
// companions (package warmstate) and signatures, the version's root
// manifest by digest (and the part manifests of a root index that no other
// version or tombstone shares), then the tombstone by digest, which removes
// the protective, human and tombstone tags that point at it on registries
// that support deleting manifests. Blobs are never deleted here. A version
// that has been sealed again loses only this tombstone; the error then
// wraps ErrKept.
func Purge(ctx context.Context, t oci.Target, rec Deleted, opt PurgeOptions) error {
	st, err := stateOf(ctx, t, rec.Digest)
	if err != nil {
		return err
	}
	if len(st.sealed) > 0 {
		if err := deleteManifest(ctx, t, rec.Tombstone); err != nil {
			return err
		}
		return fmt.Errorf("%s: %w: sealed again (restored or re-pushed); removed only its tombstone %s", rec.Digest, ErrKept, rec.Tag)
	}
	if len(st.human) > 0 {
		return fmt.Errorf("%s: %w: tagged %v since it was deleted", rec.Digest, ErrKept, st.human)
	}
	if err := refCheck(ctx, opt.Sources, rec.Digest, nil, Policy{}); err != nil {
		return fmt.Errorf("%s: %w", rec.Digest, err)
	}
	var parts []ocispec.Descriptor
	if rec.Root.MediaType == ocispec.MediaTypeImageIndex {
		b, err := fetchExact(ctx, t, rec.Root)
		if err != nil && !errors.Is(err, errdef.ErrNotFound) {
			return fmt.Errorf("%s: %w", rec.Digest, err)
		}
		if err == nil {
			var idx ocispec.Index
			if err := json.Unmarshal(b, &idx); err != nil {
				return fmt.Errorf("%s: %w", rec.Digest, err)
			}
			inUse, err := partsInUse(ctx, t, rec.Digest)
			if err != nil {
				return err
			}
			for _, p := range idx.Manifests {
				if !inUse[p.Digest] {
					parts = append(parts, p)
				}
			}
		}
	}
	if err := deleteCompanions(ctx, t, rec.Root); err != nil {
		return err
	}
	if err := deleteSignatures(ctx, t, rec.Root); err != nil {
		return err
	}
	if err := deleteManifest(ctx, t, rec.Root); err != nil {
		// A registry may refuse to delete a manifest an index still lists:
		// delete the tombstone first, then try again.
		if terr := deleteManifest(ctx, t, rec.Tombstone); terr != nil {
			return fmt.Errorf("%s: %w", rec.Digest, err)
		}
		if err := deleteManifest(ctx, t, rec.Root); err != nil {
			return fmt.Errorf("%s: %w", rec.Digest, err)
		}
	}
	for _, p := range parts {
		if p.MediaType == "" {
			p.MediaType = ocispec.MediaTypeImageManifest
		}
		if err := deleteManifest(ctx, t, p); err != nil {
			return fmt.Errorf("%s: part: %w", rec.Digest, err)
		}
	}
	return deleteManifest(ctx, t, rec.Tombstone)
}

// partsInUse returns the part manifests that the root indexes of every
// version and tombstone but except list.
func partsInUse(ctx context.Context, t oci.Target, except digest.Digest) (map[digest.Digest]bool, error) {
	tags, err := oci.ListTags(ctx, t)
	if err != nil {
		return nil, err
	}
	var cand []string
	for _, tag := range tags {
		_, _, sealed := oci.ParseProtectiveTag(tag)
		_, _, deleted := ParseDeletedTag(tag)
		if sealed || deleted {
			cand = append(cand, tag)
		}
	}
	res, err := versions.ResolveTags(ctx, t, cand)
	if err != nil {
		return nil, err
	}
	inUse := map[digest.Digest]bool{}
	seen := map[digest.Digest]bool{}
	var visit func(desc ocispec.Descriptor, depth int) error
	visit = func(desc ocispec.Descriptor, depth int) error {
		if seen[desc.Digest] || depth > 2 {
			return nil
		}
		seen[desc.Digest] = true
		b, err := fetchExact(ctx, t, desc)
		if errors.Is(err, errdef.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		var idx ocispec.Index
		if json.Unmarshal(b, &idx) != nil || idx.MediaType != ocispec.MediaTypeImageIndex {
			return nil
		}
		for _, m := range idx.Manifests {
			switch {
			case idx.ArtifactType == ArtifactTypeTombstone && m.Digest != except:
				if err := visit(m, depth+1); err != nil {
					return err
				}
			case idx.ArtifactType != ArtifactTypeTombstone && desc.Digest != except:
				inUse[m.Digest] = true
			}
		}
		return nil
	}
	for _, desc := range res {
		if desc.Digest == except {
			continue
		}
		if err := visit(desc, 0); err != nil {
			return nil, err
		}
	}
	return inUse, nil
}

// ApplyOptions configure Apply.
type ApplyOptions struct {
	Sources Sources   // re-read right before each deletion; nil: none
	Now     time.Time // deletion time; zero: time.Now()
	// OnResult is called after each version or tombstone is handled.
	OnResult func(Result)
}

// Result is what Apply did with one version or tombstone.
type Result struct {
	Digest    digest.Digest `json:"digest"`
	Action    Action        `json:"action"`
	Done      bool          `json:"done"`
	Tombstone string        `json:"tombstone,omitempty"` // the tombstone tag of a soft delete
	Skipped   string        `json:"skipped,omitempty"`   // why a re-check kept it after all
	Error     string        `json:"error,omitempty"`
	// ImageViews counts the image views deleted with the version.
	ImageViews int `json:"image_views,omitempty"`
	// Warning is what went wrong after the version was deleted.
	Warning string `json:"warning,omitempty"`
}

// Apply carries the plan out: it soft-deletes every version planned for
// DELETE and purges every tombstone planned for PURGE. Right before each,
// it re-reads the version's tags and the references (opt.Sources): a
// version that gained a kept tag or a reference since the plan, or that
// is already gone, is skipped. Versions sealed after the plan are not in it
// and are never touched. Apply goes on after a failure; the error joins
// them all.
func Apply(ctx context.Context, t oci.Target, plan *Plan, opt ApplyOptions) ([]Result, error) {
	var out []Result
	var errs []error
	report := func(r Result, err error) {
		switch {
		case err == nil:
			r.Done = true
		case errors.Is(err, ErrKept) || errors.Is(err, ErrNotLive):
			r.Skipped = err.Error()
		default:
			r.Error = err.Error()
			errs = append(errs, err)
		}
		out = append(out, r)
		if opt.OnResult != nil {
			opt.OnResult(r)
		}
	}
	for _, d := range plan.Versions {
		if d.Action != ActionDelete {
			continue
		}
		if err := ctx.Err(); err != nil {
			return out, errors.Join(append(errs, err)...)
		}
		rec, err := SoftDelete(ctx, t, d.Digest, DeleteOptions{
			Now: opt.Now,
			Check: func(ctx context.Context, tags []string) error {
				if err := refCheck(ctx, opt.Sources, d.Digest, tags, plan.Policy); err != nil {
					return fmt.Errorf("%s: %w", d.Digest, err)
				}
				return nil
			},
		})
		r := Result{Digest: d.Digest, Action: ActionDelete}
		if err == nil {
			// The version is deleted; its image views go with it. Failing
			// that (a registry with deletes disabled) is a warning.
			views, verr := DeleteImageViews(ctx, t, d.Digest)
			r.ImageViews = len(views)
			if verr != nil {
				r.Warning = verr.Error()
			}
		}
		if rec != nil {
			r.Tombstone = rec.Tag
		}
		report(r, err)
	}
	for _, d := range plan.Deleted {
		if d.Action != ActionPurge || d.Record == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			return out, errors.Join(append(errs, err)...)
		}
		err := Purge(ctx, t, *d.Record, PurgeOptions{Sources: opt.Sources})
		report(Result{Digest: d.Digest, Action: ActionPurge, Tombstone: d.Record.Tag}, err)
	}
	return out, errors.Join(errs...)
}

// Swept is what SweepLayout removed.
type Swept struct {
	Blobs int   `json:"blobs"`
	Bytes int64 `json:"bytes"`
}

// SweepLayout removes from the OCI layout at dir every blob that no
// manifest listed in its index.json reaches through descriptors (config,
// layers, manifests, subject), except blobs modified less than minAge ago,
// which a push still running may be about to reference. Only bdnvol, as the
// layout's only writer, may do this; registries collect their own garbage.
// It works through directory descriptors and follows no symlink: a symlink
// as blobs/ is an error (wrapping oci.ErrInvalidLayout), one as an
// algorithm's directory or a blob is left alone.
func SweepLayout(ctx context.Context, dir string, minAge time.Duration) (Swept, error) {
	var sw Swept
	reach, err := oci.LayoutReachable(ctx, dir)
	if err != nil {
		return sw, fmt.Errorf("nothing swept: %w", err)
	}
	root := filepath.Join(dir, ocispec.ImageBlobsDir)
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return sw, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	bfd, err := openDirNoFollow(dfd, ocispec.ImageBlobsDir, root)
	unix.Close(dfd)
	if err != nil {
		return sw, err
	}
	defer unix.Close(bfd)
	algs, err := beneath.Names(bfd, root)
	if err != nil {
		return sw, err
	}
	cutoff := time.Now().Add(-minAge)
	for _, alg := range algs {
		var st unix.Stat_t
		if err := unix.Fstatat(bfd, alg, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		adir := filepath.Join(root, alg)
		afd, err := openDirNoFollow(bfd, alg, adir)
		if err != nil {
			return sw, err
		}
		n, size, err := sweepAlg(ctx, afd, adir, digest.Algorithm(alg), reach, minAge, cutoff)
		unix.Close(afd)
		sw.Blobs += n
		sw.Bytes += size
		if err != nil {
			return sw, err
		}
	}
	return sw, nil
}

// sweepAlg removes the unreachable regular files old enough in the
// directory afd (adir) of the blobs of algorithm alg.
func sweepAlg(ctx context.Context, afd int, adir string, alg digest.Algorithm, reach map[digest.Digest]bool, minAge time.Duration, cutoff time.Time) (int, int64, error) {
	names, err := beneath.Names(afd, adir)
	if err != nil {
		return 0, 0, err
	}
	var n int
	var size int64
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return n, size, err
		}
		d := digest.NewDigestFromEncoded(alg, name)
		if d.Validate() != nil || reach[d] {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(afd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if minAge > 0 && time.Unix(st.Mtim.Unix()).After(cutoff) {
			continue
		}
		if err := unix.Unlinkat(afd, name, 0); err != nil {
			return n, size, &os.PathError{Op: "remove", Path: filepath.Join(adir, name), Err: err}
		}
		n++
		size += st.Size
	}
	return n, size, nil
}

// openDirNoFollow opens the directory name in dfd (full, for messages)
// without following a symlink.
func openDirNoFollow(dfd int, name, full string) (int, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return -1, fmt.Errorf("%s: %w: a symlink or a file is where a directory has to be", full, oci.ErrInvalidLayout)
	}
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: full, Err: err}
	}
	return fd, nil
}
