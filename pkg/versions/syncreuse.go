package versions

import (
	"context"
	"encoding/json"
	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/source"
)

// AnnotationSourceFiles is the root-manifest annotation where a sync of an
// S3 or GCS source records what the store said of each file (JSON: the
// store's scope and one identifier per path), so that the next sync can
// tell the files the store did not rewrite.
const AnnotationSourceFiles = "io.bdnvol.source.files"

// MaxSourceRecord bounds the record a version carries (manifests are at
// most 4 MiB); a source whose record is longer gets none, and its next
// sync reads every file.
const MaxSourceRecord = 1 << 20

// sourceRecord is the JSON form of AnnotationSourceFiles.
type sourceRecord struct {
	Scope string            `json:"scope"`
	Files map[string]string `json:"files"`
}

// encodeRecord is the annotation for ids, or "" when there is nothing to
// record or it would be longer than MaxSourceRecord.
func encodeRecord(ids source.Identities) string {
	if ids.Scope == "" || len(ids.Files) == 0 {
		return ""
	}
	b, err := json.Marshal(sourceRecord{Scope: ids.Scope, Files: ids.Files}) // keys sorted: deterministic
	if err != nil || len(b) > MaxSourceRecord {
		return ""
	}
	return string(b)
}

// previousVersion is the version a sync to tag follows: the one tag points
// at, else the newest of the repository; nil when there is none or it
// cannot be read (the sync then reads every file).
func previousVersion(ctx context.Context, t oci.Target, tag string) *layout.Version {
	ref := tag
	if _, err := t.Resolve(ctx, ref); err != nil {
		vs, err := List(ctx, t)
		if err != nil || len(vs) == 0 {
			return nil
		}
		ref = vs[0].Digest.String()
	}
	d, err := t.Resolve(ctx, ref)
	if err != nil {
		return nil
	}
	v, err := origin.Open(ctx, t, d)
	if err != nil {
		return nil
	}
	return v
}

// previousRecord reads the source record of v's root, nil when it has
// none or v is nil. The root is fetched verified against its digest.
func previousRecord(ctx context.Context, t oci.Target, v *layout.Version) *sourceRecord {
	if v == nil || v.Root.Size > oci.MaxManifestBytes {
		return nil
	}
	b, err := verify.Fetch(ctx, t, "root", v.Root)
	if err != nil {
		return nil
	}
	var root struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(b, &root) != nil || root.Annotations[AnnotationSourceFiles] == "" {
		return nil
	}
	var rec sourceRecord
	if json.Unmarshal([]byte(root.Annotations[AnnotationSourceFiles]), &rec) != nil || rec.Scope == "" {
		return nil
	}
	return &rec
}

// reuseUnchanged gives each file entry that the store identifies as it did
// for the previous version (same scope, same path, same identifier) and
// that the previous version holds at that path with the same size the
// digest the previous version gives it, so that the push takes its chunks
// from there instead of reading it. It returns how many it matched, with
// the files whose digest the source states (an OCI source's raw layers)
// and the previous version holds with the same size: the push takes those
// chunks from there too, without reading them.
func reuseUnchanged(entries []push.Entry, ids source.Identities, rec *sourceRecord, x *layout.Index) int {
	if x == nil {
		return 0
	}
	n := statedUnchanged(entries, x)
	if rec == nil || ids.Scope == "" || rec.Scope != ids.Scope {
		return n
	}
	for i := range entries {
		e := &entries[i]
		id := ids.Files[e.Path]
		if e.Type != layout.TypeFile || e.Digest != "" || id == "" || rec.Files[e.Path] != id {
			continue
		}
		k, ok := x.Find(e.Path)
		if !ok || x.Kind(k) != layout.TypeFile {
			continue
		}
		if f := x.File(k); f.Size == e.Size && f.Digest != "" {
			e.Digest = f.Digest
			n++
		}
	}
	return n
}

// statedUnchanged counts the file entries whose digest the source states
// and that the previous version x holds, same digest and size.
func statedUnchanged(entries []push.Entry, x *layout.Index) int {
	var have map[digest.Digest]int64
	n := 0
	for _, e := range entries {
		if e.Type != layout.TypeFile || e.Digest == "" {
			continue
		}
		if have == nil {
			have = map[digest.Digest]int64{}
			for k := range x.Len() {
				if f := x.File(k); f.Type == layout.TypeFile && f.Digest != "" {
					have[f.Digest] = f.Size
				}
			}
		}
		if size, ok := have[e.Digest]; ok && size == e.Size {
			n++
		}
	}
	return n
}
