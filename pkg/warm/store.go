package warm

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/mounts"
)

// ErrNoRecord means the cache has no record of a version.
var ErrNoRecord = errors.New("no record of this version in the cache")

// ErrBadRecord is wrapped when a version record on disk names a digest
// that is not a well-formed sha256 digest, or a version other than the one
// its file is named after.
var ErrBadRecord = errors.New("malformed version record")

// Record is what the cache directory remembers of one version it was asked
// to hold: written when the version is warmed or mounted.
type Record struct {
	Ref      string             `json:"ref"`    // as given, maybe a tag
	Pinned   string             `json:"pinned"` // HOST/REPO@sha256:...
	Root     ocispec.Descriptor `json:"root"`
	Patterns string             `json:"patterns,omitempty"` // the globs warmed; "" for every file
	Chunks   []Blob             `json:"chunks"`             // the blobs the version (or its globs) needs
	Warmed   time.Time          `json:"warmed,omitzero"`    // when a warm last completed
	Used     time.Time          `json:"used,omitzero"`      // when it was last mounted
}

// Blob is one chunk a version needs.
type Blob struct {
	Digest digest.Digest `json:"digest"`
	Size   int64         `json:"size"`
}

// Bytes returns the size of the blobs r needs.
func (r Record) Bytes() int64 {
	var n int64
	for _, b := range r.Chunks {
		n += b.Size
	}
	return n
}

// Descriptors returns r's blobs as descriptors.
func (r Record) Descriptors() []ocispec.Descriptor {
	out := make([]ocispec.Descriptor, len(r.Chunks))
	for i, b := range r.Chunks {
		out[i] = ocispec.Descriptor{Digest: b.Digest, Size: b.Size}
	}
	return out
}

// Store is the directory of version records and mount leases next to a
// chunk cache.
type Store struct{ Dir string }

// StoreOf returns the record store of cache c.
func StoreOf(c *chunkcache.Cache) Store { return Store{Dir: filepath.Join(c.Dir(), "versions")} }

func (s Store) path(d digest.Digest) string { return filepath.Join(s.Dir, d.Encoded()+".json") }

// Put writes r, replacing the record of the same version.
func (s Store) Put(r Record) error {
	if err := r.Root.Digest.Validate(); err != nil {
		return fmt.Errorf("record of %s: %w", r.Ref, err)
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fmt.Errorf("version records: %w", err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(s.path(r.Root.Digest), b, 0o600); err != nil {
		return fmt.Errorf("record of %s: %w", r.Pinned, err)
	}
	return nil
}

// Get returns the record of the version d.
func (s Store) Get(d digest.Digest) (Record, error) {
	b, err := os.ReadFile(s.path(d))
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, fmt.Errorf("%s: %w", d, ErrNoRecord)
	}
	if err != nil {
		return Record{}, fmt.Errorf("record of %s: %w", d, err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("record of %s: %w", d, err)
	}
	if err := r.check(d); err != nil {
		return Record{}, fmt.Errorf("record of %s: %w: %w", d, ErrBadRecord, err)
	}
	return r, nil
}

// check refuses a record whose digests could name paths outside the cache
// (every one is joined into a path): each must be a sha256 digest of 64
// hex digits, and the root the version d its file is named after.
func (r Record) check(d digest.Digest) error {
	if err := checkDigest(r.Root.Digest); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	if r.Root.Digest != d {
		return fmt.Errorf("root %s in the record of another version", r.Root.Digest)
	}
	for i, b := range r.Chunks {
		if err := checkDigest(b.Digest); err != nil {
			return fmt.Errorf("chunk %d: %w", i, err)
		}
	}
	return nil
}

// checkDigest accepts a well-formed sha256 digest only.
func checkDigest(d digest.Digest) error {
	p, err := digest.Parse(string(d))
	if err != nil {
		return fmt.Errorf("digest %q: %w", string(d), err)
	}
	if p.Algorithm() != digest.SHA256 || len(p.Encoded()) != 64 {
		return fmt.Errorf("digest %q: want sha256 and 64 hex digits", string(d))
	}
	return nil
}

// List returns every well-formed record, by reference.
func (s Store) List() ([]Record, error) {
	recs, _, err := s.Records()
	return recs, err
}

// Records is List that also returns why each malformed record (one
// wrapping ErrBadRecord) was skipped.
func (s Store) Records() (recs []Record, skipped []error, err error) {
	des, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("version records: %w", err)
	}
	var out []Record
	for _, e := range des {
		hexd, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		d := digest.NewDigestFromEncoded(digest.SHA256, hexd)
		if d.Validate() != nil {
			continue
		}
		r, err := s.Get(d)
		if errors.Is(err, ErrBadRecord) {
			skipped = append(skipped, err)
			continue
		}
		if err != nil {
			continue // a torn or foreign file: not ours to judge here
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, skipped, nil
}

// Delete removes the record of d.
func (s Store) Delete(d digest.Digest) error {
	if err := os.Remove(s.path(d)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("record of %s: %w", d, err)
	}
	return nil
}

// leasePrefix names the lease files of d.
func (s Store) leasePrefix(d digest.Digest) string { return d.Encoded() + ".mount-" }

// Lease records that the version d is mounted at mountpoint; the lease
// holds while that mountpoint is mounted. Release drops it.
func (s Store) Lease(d digest.Digest, mountpoint string) (release func(), err error) {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("version records: %w", err)
	}
	h := sha256.Sum256([]byte(mountpoint))
	p := filepath.Join(s.Dir, s.leasePrefix(d)+hex.EncodeToString(h[:8]))
	if err := os.WriteFile(p, []byte(mountpoint), 0o644); err != nil {
		return nil, fmt.Errorf("lease of %s: %w", d, err)
	}
	return func() { os.Remove(p) }, nil
}

// InUse reports whether a mount holds the version d now: a lease whose
// mountpoint is still mounted. Leases of mounts that are gone are removed.
func (s Store) InUse(d digest.Digest) bool {
	ps, _ := filepath.Glob(filepath.Join(s.Dir, s.leasePrefix(d)+"*"))
	used := false
	for _, p := range ps {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if _, ok := mounts.At(string(b)); ok {
			used = true
			continue
		}
		os.Remove(p)
	}
	return used
}
