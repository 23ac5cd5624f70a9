package replicate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Side is one end of a copy: a repository and the reference that named it.
type Side struct {
	Ref    oci.Ref
	Target oci.Target
}

// Options configure a copy. Zero values select defaults.
type Options struct {
	// Jobs bounds the concurrent blob checks and transfers; <= 0 means 8.
	Jobs int
	// Tags are pointed at the copied version at the destination; nil means
	// the destination reference's tag, else the source reference's.
	Tags []string
	// Referrers also copies the manifests whose subject is a copied root
	// (signatures, image views), and theirs.
	Referrers bool
	// Attempts bounds the transfers tried for one blob; <= 0 means 3.
	Attempts int
	// Counters receive progress: Total the bytes of the blobs, Processed
	// those found or sent, Sent those sent. May be nil.
	Counters *progress.Counters
	// PartSize is the destination's upload part size (oci.Options.PartSize);
	// a blob larger than it is read whole into memory, verified, and sent
	// in parts. 0: blobs stream in one request each, and after a
	// destination answers 413 to one, they are sent as with PartSize set.
	PartSize int64
	// MaxBuffered bounds the blob read into memory to be sent in parts;
	// <= 0 means 256 MiB (the largest chunk). A larger blob streams.
	MaxBuffered int64
	// Logf (if set) is told of retried blobs and of a switch to parts.
	Logf func(format string, args ...any)
	// Now is the sealing time of a protective tag made for a volume whose
	// source has none; zero means time.Now.
	Now time.Time
	// MaxBlobBytes bounds the size a manifest may claim for one blob (a
	// layer, a config); a larger one fails the copy before anything is
	// sent. <= 0 means DefaultMaxBlobBytes.
	MaxBlobBytes int64
	// MaxManifests bounds the manifests and indexes of one copy, referrers
	// included; <= 0 means DefaultMaxManifests.
	MaxManifests int
}

// Bounds of one copy, which its source's manifests could otherwise size.
const (
	// DefaultMaxBlobBytes is the default Options.MaxBlobBytes: far above a
	// bdnvol chunk (256 MiB) and a container image layer, far below what a
	// forged descriptor can claim (2^63).
	DefaultMaxBlobBytes = 64 << 30
	// DefaultMaxManifests is the default Options.MaxManifests: above the
	// 20,000 part manifests a version may have.
	DefaultMaxManifests = 25_000
	// MaxBlobs bounds the distinct blobs of one copy: the chunks a version
	// may have (layout.MaxChunks).
	MaxBlobs = layout.MaxChunks
	// MaxReferrerDepth bounds how deeply referrers of referrers are
	// followed (a version, its image view, the view's signature: 2).
	MaxReferrerDepth = 4
)

// maxHeldManifestBytes bounds the manifest bytes a copy keeps in memory
// between reading its graph and pushing it; the manifests past it are read
// from the source again (and verified again) when pushed. A variable for
// tests.
var maxHeldManifestBytes int64 = 64 << 20

// Report says what a copy moved.
type Report struct {
	Digest            digest.Digest `json:"digest,omitempty"`
	Tags              []string      `json:"tags"`
	Blobs             int           `json:"blobs"`
	BlobsSent         int           `json:"blobs_sent"`
	BlobsSkipped      int           `json:"blobs_skipped"`
	BlobsMounted      int           `json:"blobs_mounted"`
	Bytes             int64         `json:"bytes"`
	BytesSent         int64         `json:"bytes_sent"`
	BytesSkipped      int64         `json:"bytes_skipped"`
	BytesMounted      int64         `json:"bytes_mounted"`
	Manifests         int           `json:"manifests"`
	ManifestsSent     int           `json:"manifests_sent"`
	ManifestBytesSent int64         `json:"manifest_bytes_sent"`
	// Moved lists the human tags the copy moved from another version the
	// destination had them on.
	Moved []TagMove `json:"moved"`
	// Kept lists the source's tags the copy left as the destination has
	// them (its history records, signatures it would have replaced).
	Kept []KeptTag `json:"kept,omitempty"`
}

// Add adds the counts of o to r (the digest and tags are appended).
func (r *Report) Add(o *Report) {
	r.Tags = append(r.Tags, o.Tags...)
	r.Moved = append(r.Moved, o.Moved...)
	r.Kept = append(r.Kept, o.Kept...)
	r.Blobs += o.Blobs
	r.BlobsSent += o.BlobsSent
	r.BlobsSkipped += o.BlobsSkipped
	r.BlobsMounted += o.BlobsMounted
	r.Bytes += o.Bytes
	r.BytesSent += o.BytesSent
	r.BytesSkipped += o.BytesSkipped
	r.BytesMounted += o.BytesMounted
	r.Manifests += o.Manifests
	r.ManifestsSent += o.ManifestsSent
	r.ManifestBytesSent += o.ManifestBytesSent
}

// maxDepth bounds how deeply indexes may nest.
const maxDepth = 8

// Copy copies the version that src.Ref names (by tag or digest) to dst,
// with its protective tags and cosign signature tags, and points the tags
// of opt (or dst.Ref's or src.Ref's tag) at it, last.
func Copy(ctx context.Context, src, dst Side, opt Options) (*Report, error) {
	// The manifest is fetched by the digest resolved and checked against
	// it, so a registry that claims a digest must serve its bytes.
	root, err := oci.Resolve(ctx, src.Target, src.Ref)
	if err != nil {
		return nil, err
	}
	c := newCopier(src, dst, opt)
	if err := c.addRoot(ctx, root, nil, 0); err != nil {
		return nil, err
	}
	tags := opt.Tags
	if tags == nil {
		switch {
		case dst.Ref.Tag != "":
			tags = []string{dst.Ref.Tag}
		case src.Ref.Tag != "":
			tags = []string{src.Ref.Tag}
		}
	}
	// The tags that keep the version and its signatures at the source go
	// with it: its protective tags, and cosign's sha256-<hex>.sig/.att/.sbom
	// of the version and of each referrer the copy carries (a warm-state
	// companion's signature is about the companion, not the version).
	srcTags, err := oci.ListTags(ctx, src.Target)
	if err != nil {
		return nil, fmt.Errorf("%s: list tags: %w", src.Ref.Repo(), err)
	}
	hex := root.Digest.Encoded()
	protected := false
	for _, t := range srcTags {
		_, h, ok := oci.ParseProtectiveTag(t)
		sig := strings.HasPrefix(t, root.Digest.Algorithm().String()+"-"+hex+".")
		if subject, isSig := signatureSubject(t); isSig && strings.Contains(t, ".") && c.rooted[subject] {
			sig = true
		}
		if !(ok && strings.HasPrefix(hex, h)) && !sig {
			continue
		}
		d, err := src.Target.Resolve(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("%s: resolve %s: %w", src.Ref.Repo(), t, err)
		}
		if ok {
			if d.Digest != root.Digest {
				continue
			}
			protected = true
		} else if err := c.addRoot(ctx, d, nil, 0); err != nil {
			return nil, err
		}
		c.tag(d, t)
	}
	if !protected && c.artifactType(root.Digest) == layout.ArtifactTypeVolume {
		// A protective tag the destination already gives it will do.
		if protected, err = hasProtectiveTag(ctx, dst, root); err != nil {
			return nil, err
		}
	}
	if !protected && c.artifactType(root.Digest) == layout.ArtifactTypeVolume {
		now := opt.Now
		if now.IsZero() {
			now = time.Now()
		}
		t := oci.ProtectiveTag(root.Digest, now)
		c.tag(root, t)
	}
	for _, t := range tags {
		c.tag(root, t)
	}
	if err := c.settleTags(ctx, nil); err != nil {
		return nil, err
	}
	if err := c.run(ctx); err != nil {
		return nil, err
	}
	c.report.Digest = root.Digest
	c.report.Tags = c.tagNames()
	return &c.report, nil
}

// hasProtectiveTag reports whether a protective tag in dst points at root.
func hasProtectiveTag(ctx context.Context, dst Side, root ocispec.Descriptor) (bool, error) {
	tags, err := oci.ListTags(ctx, dst.Target)
	if err != nil {
		return false, fmt.Errorf("%s: list tags: %w", dst.Ref.Repo(), err)
	}
	for _, t := range tags {
		if _, h, ok := oci.ParseProtectiveTag(t); ok && strings.HasPrefix(root.Digest.Encoded(), h) {
			if d, err := dst.Target.Resolve(ctx, t); err == nil && d.Digest == root.Digest {
				return true, nil
			}
		}
	}
	return false, nil
}

// CopyAll copies every tag of src's repository, and what it points to, to
// dst's repository under the same tag: protective and tombstone tags, tag
// history, cosign signature tags and referrers indexes included.
func CopyAll(ctx context.Context, src, dst Side, opt Options) (*Report, error) {
	tags, err := oci.ListTags(ctx, src.Target)
	if err != nil {
		return nil, fmt.Errorf("%s: list tags: %w", src.Ref.Repo(), err)
	}
	c := newCopier(src, dst, opt)
	// Protective and tombstone tags first, then human tags, then the tags
	// of referrers and signatures, whose subjects are then tagged.
	rank := func(t string) int {
		switch {
		case strings.HasPrefix(t, oci.SealedTagPrefix), strings.HasPrefix(t, oci.DeletedTagPrefix):
			return 0
		case strings.HasPrefix(t, "sha256-"):
			return 2
		}
		return 1
	}
	slices.SortStableFunc(tags, func(a, b string) int { return rank(a) - rank(b) })
	for _, t := range tags {
		d, err := oci.Resolve(ctx, src.Target, oci.Ref{Layout: src.Ref.Layout, Registry: src.Ref.Registry, Repository: src.Ref.Repository, Tag: t})
		if err != nil {
			return nil, err
		}
		if err := c.addRoot(ctx, d, nil, 0); err != nil {
			return nil, err
		}
		c.tag(d, t)
	}
	srcSet := make(map[string]bool, len(tags))
	for _, t := range tags {
		srcSet[t] = true
	}
	if err := c.settleTags(ctx, srcSet); err != nil {
		return nil, err
	}
	if err := c.run(ctx); err != nil {
		return nil, err
	}
	c.report.Tags = c.tagNames()
	return &c.report, nil
}

// manifest is a manifest or index to push, with its bytes (nil past
// maxHeldManifestBytes: read again when pushed).
type manifest struct {
	desc ocispec.Descriptor
	b    []byte
	at   string // artifactType
}

type tagging struct {
	desc ocispec.Descriptor
	tag  string
}

// copier holds the graph of what to copy: blobs in no order, manifests
// children first, tags last.
type copier struct {
	src, dst  Side
	opt       Options
	mountFrom string // the source repository, when both are on one registry

	seen      map[digest.Digest]bool
	rooted    map[digest.Digest]bool // roots whose referrers were added
	blobs     []ocispec.Descriptor
	manifests []manifest
	byDigest  map[digest.Digest]int // index into manifests
	tags      []tagging
	held      int64           // bytes of the manifests' b
	dstTagSet map[string]bool // the destination's tags, once listed
	madeEmpty bool            // the empty JSON blob is the copy's, not the source's

	srcReferrers map[digest.Digest][]ocispec.Descriptor // a layout source's, by subject

	report Report
	parts  atomic.Bool // the destination refused a whole blob body (413)
}

func newCopier(src, dst Side, opt Options) *copier {
	if opt.Jobs <= 0 {
		opt.Jobs = 8
	}
	if opt.Attempts <= 0 {
		opt.Attempts = 3
	}
	if opt.MaxBuffered <= 0 {
		opt.MaxBuffered = 256 << 20
	}
	if opt.MaxBlobBytes <= 0 {
		opt.MaxBlobBytes = DefaultMaxBlobBytes
	}
	if opt.MaxManifests <= 0 {
		opt.MaxManifests = DefaultMaxManifests
	}
	c := &copier{src: src, dst: dst, opt: opt, seen: map[digest.Digest]bool{}, rooted: map[digest.Digest]bool{}, byDigest: map[digest.Digest]int{}}
	if src.Ref.Layout == "" && dst.Ref.Layout == "" && src.Ref.Registry == dst.Ref.Registry && src.Ref.Repository != dst.Ref.Repository {
		c.mountFrom = src.Ref.Repository
	}
	return c
}

// tagNames returns the tags the copy points, in order.
func (c *copier) tagNames() []string {
	out := make([]string, 0, len(c.tags))
	for _, t := range c.tags {
		out = append(out, t.tag)
	}
	return out
}

func (c *copier) tag(d ocispec.Descriptor, t string) {
	c.tags = append(c.tags, tagging{desc: d, tag: t})
}

func (c *copier) artifactType(d digest.Digest) string {
	if i, ok := c.byDigest[d]; ok {
		return c.manifests[i].at
	}
	return ""
}

// addRoot adds the graph of root (whose bytes are b, or nil to fetch them)
// and, with opt.Referrers, the graphs of its referrers, which are referrers
// of a copied root refDepth deep (0: root is no referrer).
func (c *copier) addRoot(ctx context.Context, root ocispec.Descriptor, b []byte, refDepth int) error {
	if err := c.addManifest(ctx, root, b, 0); err != nil {
		return err
	}
	if !c.opt.Referrers || c.rooted[root.Digest] {
		return nil // a root many tags name is asked for its referrers once
	}
	c.rooted[root.Digest] = true
	refs, err := c.referrers(ctx, root)
	if err != nil {
		return err
	}
	for _, r := range refs {
		if c.seen[r.Digest] {
			continue
		}
		if refDepth >= MaxReferrerDepth {
			return fmt.Errorf("%s: referrer %s of %s: referrers of referrers nest more than %d deep", c.src.Ref.Repo(), r.Digest, root.Digest, MaxReferrerDepth)
		}
		if err := c.addRoot(ctx, ocispec.Descriptor{MediaType: r.MediaType, Digest: r.Digest, Size: r.Size, ArtifactType: r.ArtifactType}, nil, refDepth+1); err != nil {
			return err
		}
	}
	return nil
}

// subjectIndexer is a source (an OCI layout) that finds the referrers of
// all its manifests in one pass.
type subjectIndexer interface {
	ReferrersBySubject(ctx context.Context) (map[digest.Digest][]ocispec.Descriptor, error)
}

// referrers returns the referrers of root at the source: from one pass
// over a layout (asking it per root would read every manifest it lists
// for each), else from the registry.
func (c *copier) referrers(ctx context.Context, root ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	si, ok := c.src.Target.(subjectIndexer)
	if !ok {
		return oci.Referrers(ctx, c.src.Target, root, "")
	}
	if c.srcReferrers == nil {
		m, err := si.ReferrersBySubject(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: referrers: %w", c.src.Ref.Repo(), err)
		}
		c.srcReferrers = m
	}
	return c.srcReferrers[root.Digest], nil
}

// node is what a manifest or an index names.
type node struct {
	ArtifactType string               `json:"artifactType"`
	Config       *ocispec.Descriptor  `json:"config"`
	Layers       []ocispec.Descriptor `json:"layers"`
	Manifests    []ocispec.Descriptor `json:"manifests"`
	Blobs        []ocispec.Descriptor `json:"blobs"`
}

func checkDesc(d ocispec.Descriptor) error {
	if err := d.Digest.Validate(); err != nil {
		return fmt.Errorf("descriptor %q: %w", d.Digest, err)
	}
	if d.Size < 0 {
		return fmt.Errorf("descriptor %s: negative size %d", d.Digest, d.Size)
	}
	return nil
}

// addManifest adds the manifest d, after its children.
func (c *copier) addManifest(ctx context.Context, d ocispec.Descriptor, b []byte, depth int) error {
	if c.seen[d.Digest] {
		return nil
	}
	if depth > maxDepth {
		return fmt.Errorf("manifest %s: indexes nested more than %d deep", d.Digest, maxDepth)
	}
	if err := checkDesc(d); err != nil {
		return err
	}
	if d.Size > oci.MaxManifestBytes {
		return fmt.Errorf("manifest %s: %d bytes: %w", d.Digest, d.Size, errdef.ErrSizeExceedsLimit)
	}
	if len(c.manifests) >= c.opt.MaxManifests {
		return fmt.Errorf("%s: manifest %s: the copy has more than %d manifests (referrers included): %w", c.src.Ref.Repo(), d.Digest, c.opt.MaxManifests, errdef.ErrSizeExceedsLimit)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if b == nil {
		rc, err := c.src.Target.Fetch(ctx, d)
		if err != nil {
			return fmt.Errorf("%s: fetch manifest %s: %w", c.src.Ref.Repo(), d.Digest, err)
		}
		b, err = verify.ReadAll(rc, "manifest", d)
		rc.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", c.src.Ref.Repo(), err)
		}
	} else if err := verify.Bytes("manifest", b, d); err != nil {
		return err
	}
	var n node
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	c.seen[d.Digest] = true
	var children []ocispec.Descriptor
	if n.Config != nil {
		children = append(children, *n.Config)
	}
	children = append(children, n.Layers...)
	children = append(children, n.Blobs...)
	children = append(children, n.Manifests...)
	for _, ch := range children {
		if err := checkDesc(ch); err != nil {
			return fmt.Errorf("manifest %s: %w", d.Digest, err)
		}
		if oci.IsManifest(ch.MediaType) {
			if err := c.addManifest(ctx, ch, nil, depth+1); err != nil {
				return err
			}
			continue
		}
		if c.seen[ch.Digest] {
			continue
		}
		if ch.Size > c.opt.MaxBlobBytes {
			return fmt.Errorf("manifest %s: blob %s claims %d bytes, more than the %d a copy takes (--max-blob-size): %w", d.Digest, ch.Digest, ch.Size, c.opt.MaxBlobBytes, errdef.ErrSizeExceedsLimit)
		}
		if len(c.blobs) >= MaxBlobs {
			return fmt.Errorf("manifest %s: the copy has more than %d blobs: %w", d.Digest, MaxBlobs, errdef.ErrSizeExceedsLimit)
		}
		c.seen[ch.Digest] = true
		c.blobs = append(c.blobs, ocispec.Descriptor{MediaType: ch.MediaType, Digest: ch.Digest, Size: ch.Size})
	}
	if c.held += int64(len(b)); c.held > maxHeldManifestBytes {
		c.held -= int64(len(b))
		b = nil // read again when pushed
	}
	c.byDigest[d.Digest] = len(c.manifests)
	c.manifests = append(c.manifests, manifest{desc: ocispec.Descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size, ArtifactType: n.ArtifactType}, b: b, at: n.ArtifactType})
	return nil
}

// manifestBytes returns m's bytes: those held, or read from the source
// again and verified.
func (c *copier) manifestBytes(ctx context.Context, m manifest) ([]byte, error) {
	if m.b != nil {
		return m.b, nil
	}
	rc, err := c.src.Target.Fetch(ctx, m.desc)
	if err != nil {
		return nil, fmt.Errorf("%s: fetch manifest %s: %w", c.src.Ref.Repo(), m.desc.Digest, err)
	}
	defer rc.Close()
	b, err := verify.ReadAll(rc, "manifest", m.desc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.src.Ref.Repo(), err)
	}
	return b, nil
}

// run sends the blobs, then the manifests children first, then the tags.
func (c *copier) run(ctx context.Context) error {
	var total int64
	for _, b := range c.blobs {
		total += b.Size
	}
	if c.opt.Counters != nil {
		c.opt.Counters.Total.Add(total)
	}
	c.report.Blobs, c.report.Bytes, c.report.Manifests = len(c.blobs), total, len(c.manifests)
	if err := c.sendBlobs(ctx); err != nil {
		return err
	}
	// A layout lists its manifests and tags in one file: they are stored
	// first and listed and tagged in one update of it.
	batch, _ := c.dst.Target.(oci.Batcher)
	var list []ocispec.Descriptor
	for _, m := range c.manifests {
		if err := ctx.Err(); err != nil {
			return err
		}
		ok, err := c.dst.Target.Exists(ctx, m.desc)
		if err != nil {
			return fmt.Errorf("%s: manifest %s: %w", c.dst.Ref.Repo(), m.desc.Digest, err)
		}
		if batch != nil {
			list = append(list, m.desc)
		}
		if ok && (batch != nil || c.dst.Ref.Layout == "") {
			continue
		}
		b, err := c.manifestBytes(ctx, m)
		if err != nil {
			return err
		}
		if batch != nil {
			err = batch.Store(ctx, m.desc, bytes.NewReader(b))
		} else {
			// A layout's Push also lists a stored manifest in index.json.
			err = c.dst.Target.Push(ctx, m.desc, bytes.NewReader(b))
		}
		if err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
			return fmt.Errorf("%s: push manifest %s: %w", c.dst.Ref.Repo(), m.desc.Digest, err)
		}
		if ok {
			continue
		}
		c.report.ManifestsSent++
		c.report.ManifestBytesSent += m.desc.Size
	}
	reqs := make([]oci.TagRequest, 0, len(c.tags))
	for _, t := range c.tags {
		var b []byte
		if i, ok := c.byDigest[t.desc.Digest]; ok {
			b = c.manifests[i].b
		}
		reqs = append(reqs, oci.TagRequest{Desc: ocispec.Descriptor{MediaType: t.desc.MediaType, Digest: t.desc.Digest, Size: t.desc.Size}, Manifest: b, Tag: t.tag})
	}
	var err error
	if batch != nil {
		err = batch.Update(ctx, list, reqs)
	} else {
		err = oci.TagAll(ctx, c.dst.Target, reqs)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", c.dst.Ref.Repo(), err)
	}
	return nil
}

// sendBlobs checks and sends the blobs with bounded concurrency.
func (c *copier) sendBlobs(ctx context.Context) error {
	var mu sync.Mutex
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(c.opt.Jobs)
	for _, d := range c.blobs {
		g.Go(func() error {
			how, err := c.blob(ctx, d)
			if err != nil {
				return err
			}
			if c.opt.Counters != nil {
				c.opt.Counters.Processed.Add(d.Size)
			}
			mu.Lock()
			defer mu.Unlock()
			switch how {
			case skipped:
				c.report.BlobsSkipped++
				c.report.BytesSkipped += d.Size
			case mounted:
				c.report.BlobsMounted++
				c.report.BytesMounted += d.Size
			default:
				c.report.BlobsSent++
				c.report.BytesSent += d.Size
			}
			return nil
		})
	}
	return g.Wait()
}

type outcome int

const (
	sent outcome = iota
	skipped
	mounted
)

// blob makes the destination hold d: present already, mounted from the
// source repository, or streamed from the source.
func (c *copier) blob(ctx context.Context, d ocispec.Descriptor) (outcome, error) {
	ok, err := c.dst.Target.Exists(ctx, d)
	if err != nil {
		return 0, fmt.Errorf("%s: blob %s: %w", c.dst.Ref.Repo(), d.Digest, err)
	}
	if ok {
		return skipped, nil
	}
	if c.madeEmpty && d.Digest == ocispec.DescriptorEmptyJSON.Digest {
		// A history record the copy made needs it, and no source manifest
		// names it: it is sent from its known bytes.
		if err := c.dst.Target.Push(ctx, d, bytes.NewReader(ocispec.DescriptorEmptyJSON.Data)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
			return 0, fmt.Errorf("%s: send blob %s: %w", c.dst.Ref.Repo(), d.Digest, err)
		}
		return sent, nil
	}
	if m, ok := c.dst.Target.(registry.Mounter); ok && c.mountFrom != "" {
		var r *streamReader
		err := m.Mount(ctx, d, c.mountFrom, func() (io.ReadCloser, error) {
			rr, err := c.open(ctx, d)
			r = rr
			return rr, err
		})
		if r == nil && err == nil {
			return mounted, nil
		}
		if r != nil {
			r.Close()
			if serr := r.failure(); serr != nil && errors.Is(serr, verify.ErrDigestMismatch) {
				return 0, serr
			}
			if err == nil {
				return sent, nil
			}
		}
		// The mount failed: send the blob.
	}
	for attempt := 1; ; attempt++ {
		var err error
		if c.buffered(d) {
			err = c.sendBuffered(ctx, d)
			if errors.Is(err, verify.ErrDigestMismatch) {
				return 0, err
			}
		} else {
			r, oerr := c.open(ctx, d)
			if oerr != nil {
				return 0, oerr
			}
			err = c.dst.Target.Push(ctx, d, r)
			r.Close()
			if serr := r.failure(); serr != nil && errors.Is(serr, verify.ErrDigestMismatch) {
				return 0, serr
			}
			if tooLarge(err) && d.Size <= c.opt.MaxBuffered {
				if !c.parts.Swap(true) {
					c.logf("%s refused a whole blob body (413): sending blobs in parts", c.dst.Ref.Repo())
				}
				attempt--
				continue
			}
		}
		if err == nil || errors.Is(err, errdef.ErrAlreadyExists) {
			return sent, nil
		}
		if attempt >= c.opt.Attempts || ctx.Err() != nil {
			return 0, fmt.Errorf("%s: send blob %s: %w", c.dst.Ref.Repo(), d.Digest, err)
		}
		c.logf("blob %s: attempt %d of %d failed, retrying: %v", d.Digest, attempt, c.opt.Attempts, err)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Duration(attempt) * 500 * time.Millisecond):
		}
	}
}

func (c *copier) logf(format string, args ...any) {
	if c.opt.Logf != nil {
		c.opt.Logf(format, args...)
	}
}

// buffered reports whether d is sent from memory, in parts.
func (c *copier) buffered(d ocispec.Descriptor) bool {
	if d.Size > c.opt.MaxBuffered || c.dst.Ref.Layout != "" {
		return false
	}
	return c.parts.Load() || c.opt.PartSize > 0 && d.Size > c.opt.PartSize
}

// sendBuffered reads d whole from the source, verifies it, and pushes it
// as an io.ReaderAt, which the destination sends in parts with resumption.
func (c *copier) sendBuffered(ctx context.Context, d ocispec.Descriptor) error {
	rc, err := c.src.Target.Fetch(ctx, d)
	if err != nil {
		return fmt.Errorf("%s: fetch blob %s: %w", c.src.Ref.Repo(), d.Digest, err)
	}
	b, err := verify.ReadAll(rc, "blob", d)
	rc.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", c.src.Ref.Repo(), err)
	}
	if c.opt.Counters != nil {
		c.opt.Counters.Sent.Add(d.Size)
	}
	return c.dst.Target.Push(ctx, d, bytes.NewReader(b))
}

// tooLarge reports whether err is a registry's 413 answer.
func tooLarge(err error) bool {
	var er *errcode.ErrorResponse
	return errors.As(err, &er) && er.StatusCode == http.StatusRequestEntityTooLarge
}

// open fetches d from the source as a streamReader.
func (c *copier) open(ctx context.Context, d ocispec.Descriptor) (*streamReader, error) {
	rc, err := c.src.Target.Fetch(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("%s: fetch blob %s: %w", c.src.Ref.Repo(), d.Digest, err)
	}
	var sent *atomic.Int64
	if c.opt.Counters != nil {
		sent = &c.opt.Counters.Sent
	}
	return &streamReader{rc: rc, v: verify.Reader(rc, "blob", d), sent: sent, src: c.src.Ref.Repo()}, nil
}

// streamReader passes a source blob on while verifying it, and holds back
// the bytes of the read that completes it unless they complete the right
// digest: a source that lies never gives the destination a whole body.
type streamReader struct {
	rc   io.ReadCloser
	v    *verify.VerifyingReader
	sent *atomic.Int64
	src  string

	mu  sync.Mutex
	err error // the source's failure, sticky
}

// Read reads verified bytes; the read that ends a wrong blob returns none.
func (s *streamReader) Read(p []byte) (int, error) {
	n, err := s.v.Read(p)
	if err != nil && err != io.EOF {
		s.mu.Lock()
		if s.err == nil {
			s.err = fmt.Errorf("%s: %w", s.src, err)
		}
		s.mu.Unlock()
		return 0, err
	}
	if s.sent != nil {
		s.sent.Add(int64(n))
	}
	return n, err
}

// Close closes the source stream.
func (s *streamReader) Close() error { return s.rc.Close() }

// failure returns the source's failure, if it failed.
func (s *streamReader) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}
