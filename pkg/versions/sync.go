package versions

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/source"
)

// Annotations a sync puts on the versions it seals.
const (
	AnnotationSource   = "io.bdnvol.source"
	AnnotationRevision = "io.bdnvol.source.revision"
)

// SyncOptions configure Sync. The hooks report progress; each may be nil.
type SyncOptions struct {
	Source   source.Options
	OCI      oci.Options // for the destination; a missing OCI layout is created
	Tags     []string    // more tags to point at the version
	Jobs     int         // concurrent uploads
	Counters *progress.Counters

	OnListing  func(src string)                              // the walk starts
	OnListed   func(files int, bytes int64, revision string) // the walk is done
	OnVerified func()                                        // every file matched the source; tags move next
}

// Synced is what Sync sealed and tagged.
type Synced struct {
	*Published
	Revision string // what the source resolved to, "" when it has no revisions
	// Unchanged counts the files the store identified as it did for the
	// previous version, whose chunk lists were reused without reading them.
	Unchanged int
}

// CheckSync refuses a bad sync before any work: dst must name a tag and
// no digest, every tag must be valid, and src must open.
func CheckSync(ctx context.Context, src, dst string, tags []string, opt source.Options) error {
	ref, err := oci.ParseRef(dst)
	if err != nil {
		return err
	}
	if ref.Digest != "" {
		return fmt.Errorf("%s: sync takes a tag, not a digest", dst)
	}
	for _, tag := range append([]string{ref.Tag}, tags...) {
		if err := CheckTag(tag); err != nil {
			return err
		}
	}
	_, err = source.Open(ctx, src, opt)
	return err
}

// Sync streams the source src into a sealed version at dst, checks every
// file against what the source said of it, and only then publishes it:
// protective tag, dst's tag and Tags, history.
func Sync(ctx context.Context, src string, dst oci.Ref, opt SyncOptions) (*Synced, error) {
	s, err := source.Open(ctx, src, opt.Source)
	if err != nil {
		return nil, err
	}
	defer source.Close(s)
	opt.OCI.CreateLayout = true
	t, err := oci.Open(ctx, dst, opt.OCI)
	if err != nil {
		return nil, err
	}
	// The walk fills in the revision; Push seals after walking.
	ann := map[string]string{AnnotationSource: s.String()}
	prev := previousVersion(ctx, t, dst.Tag)
	w := &syncWalk{Source: s, opt: &opt, annotations: ann, record: previousRecord(ctx, t, prev)}
	push := push.Options{Jobs: opt.Jobs, Counters: opt.Counters, Annotations: ann}
	if prev != nil {
		push.Previous, w.previous = prev.Index, prev.Index
	}
	res, err := Publish(ctx, t, w, PublishOptions{
		Tag:   dst.Tag,
		Extra: opt.Tags,
		Push:  push,
		Check: func(x *layout.Index) error {
			if err := source.Verify(ctx, s, x); err != nil {
				return err
			}
			if opt.OnVerified != nil {
				opt.OnVerified()
			}
			return nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("sync %s to %s: %w", s, dst, err)
	}
	return &Synced{Published: res, Revision: s.Revision(), Unchanged: w.unchanged}, nil
}

// syncWalk reports the walk of a source, records its revision and the
// store's identifiers, and marks the files unchanged since the previous
// version (a file of it matches a source file by the SHA-256 the source
// states, which is the file's content digest, or by the store's identifier
// of the same object recorded in that version: never by name, size or
// date alone).
type syncWalk struct {
	source.Source
	opt         *SyncOptions
	annotations map[string]string // receives the revision and the record
	record      *sourceRecord     // the previous version's, or nil
	previous    *layout.Index     // the previous version's, or nil
	unchanged   int               // files matched by record
}

func (w *syncWalk) Walk(ctx context.Context) ([]push.Entry, error) {
	if w.opt.OnListing != nil {
		w.opt.OnListing(w.Source.String())
	}
	es, err := w.Source.Walk(ctx)
	if err != nil {
		return nil, err
	}
	var files int
	var bytes int64
	for _, e := range es {
		if e.Type == layout.TypeFile {
			files++
			bytes += e.Size
		}
	}
	rev := w.Revision()
	if rev != "" {
		w.annotations[AnnotationRevision] = rev
	}
	ids := w.Identities()
	if rec := encodeRecord(ids); rec != "" {
		w.annotations[AnnotationSourceFiles] = rec
	}
	w.unchanged = reuseUnchanged(es, ids, w.record, w.previous)
	if w.opt.OnListed != nil {
		w.opt.OnListed(files, bytes, rev)
	}
	return es, nil
}
