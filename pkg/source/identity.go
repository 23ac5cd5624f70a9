package source

import (
	"strconv"
	"strings"
	"time"
)

// Identities is what a source says of its files besides their bytes, as a
// later sync compares it: Scope names the store the files come from (the
// kind of store, its endpoint, the bucket and the prefix) and Files holds
// one identifier per listed path. Two identifiers are worth comparing only
// under the same Scope; equal ones mean the store did not rewrite the
// object since (see docs/sync.md for when that is trusted).
type Identities struct {
	Scope string
	Files map[string]string
}

// Identities returns the identifiers of the files the last Walk listed
// (after the filters), or a zero Identities when the source gives none
// (HTTP(S) files). A Hub's LFS files have none: their SHA-256 is their
// digest already.
func (r *remote) Identities() Identities {
	r.mu.Lock()
	defer r.mu.Unlock()
	scope := r.b.scope()
	if scope == "" {
		return Identities{}
	}
	ids := make(map[string]string, len(r.files))
	for p, o := range r.files {
		if o.id != "" {
			ids[p] = o.id
		}
	}
	return Identities{Scope: scope, Files: ids}
}

// idField is one field of an identifier; empty values are left out.
type idField struct{ name, value string }

// identifier joins fields as "name=value" separated by spaces, values
// quoted (strconv.Quote) so that no value can fake another field.
func identifier(fields ...idField) string {
	var b strings.Builder
	for _, f := range fields {
		if f.value == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(f.name)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(f.value))
	}
	return b.String()
}

// s3Identifier is an S3 object's identity as ListObjectsV2 gives it:
// size, ETag, last-modified time (to the precision given) and the
// algorithm and type of its additional checksum, if any. Without an ETag
// or a time it is "": nothing to trust.
func s3Identifier(size int64, etag string, modified *time.Time, checksum []string, checksumType string) string {
	if etag == "" || modified == nil || modified.IsZero() {
		return ""
	}
	return identifier(
		idField{"size", strconv.FormatInt(size, 10)},
		idField{"etag", etag},
		idField{"modified", modified.UTC().Format(time.RFC3339Nano)},
		idField{"checksum", strings.Join(checksum, ",")},
		idField{"checksum-type", checksumType},
	)
}

// gcsIdentifier is a GCS object's identity: size, generation (which GCS
// changes whenever the object's bytes are written) and its MD5 and CRC32C
// (a composite object has only the CRC32C). Without a generation or a
// hash it is "".
func gcsIdentifier(it gcsObject) string {
	if it.Generation == "" || it.MD5Hash == "" && it.CRC32C == "" {
		return ""
	}
	return identifier(
		idField{"size", it.Size},
		idField{"generation", it.Generation},
		idField{"md5", it.MD5Hash},
		idField{"crc32c", it.CRC32C},
	)
}
