package source

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/semaphore"

	"github.com/bdnvol/bdnvol/internal/pathglob"
	"github.com/bdnvol/bdnvol/internal/ratelimit"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// Sentinel errors, each wrapped with the source and the file it is about.
var (
	// ErrDigestMismatch is wrapped when a file's bytes disagree with the
	// digest the store gives for it.
	ErrDigestMismatch = errors.New("source: content does not match the digest the source gives")
	// ErrUnsupported is wrapped when a source URI has no known scheme or
	// carries something bdnvol refuses to store (credentials in a URL).
	ErrUnsupported = errors.New("source: unsupported source")
	// ErrNotFound is wrapped when a repository, bucket, prefix or file does
	// not exist.
	ErrNotFound = errors.New("source: not found")
	// ErrEmpty is wrapped when the source (after filters) has no files.
	ErrEmpty = errors.New("source: no files")
)

// Source is a remote tree to seal.
type Source interface {
	push.Source
	push.Remote
	// Revision returns what the source resolved to when it was walked (the
	// Hub commit of a revision), or "" when the source has no revisions.
	Revision() string
	// Identities returns what the store said of each file the walk
	// listed, for a later sync to compare.
	Identities() Identities
}

// Options configure Open. Zero values select defaults.
type Options struct {
	Include []string // globs; when set, only matching paths are synced
	Exclude []string // globs; matching paths are skipped
	// Endpoint overrides the S3 endpoint (else AWS_ENDPOINT_URL or AWS's);
	// a custom endpoint uses path-style addressing.
	Endpoint string
	// List makes an http(s) source a list of URLs, one per line, instead of
	// a single file.
	List bool
	// UserAgent is sent with every HTTP request.
	UserAgent string
	// Transport carries HTTP requests; nil uses a clone of
	// http.DefaultTransport that dials only addresses the network policy
	// allows (a Transport given here is checked by URL only).
	Transport http.RoundTripper
	// Limiter paces the bodies of every request (with the destination's
	// uploads, when the caller shares it); nil for no bound.
	Limiter *ratelimit.Limiter
	// AllowPrivateNetwork lets requests reach loopback and private
	// (RFC 1918, ULA, CGNAT) addresses; by default only the configured
	// endpoints and the kinds of address they resolve to may be.
	AllowPrivateNetwork bool
	// AllowLinkLocal lets requests reach link-local addresses and cloud
	// metadata services.
	AllowLinkLocal bool
	// lookup resolves host names for the network policy (tests); nil uses
	// the default resolver.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// dial connects to an address the policy allowed (tests); nil uses a
	// net.Dialer.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Concurrency bounds the range requests in flight per source; <= 0
	// means 16.
	Concurrency int
	// BlockSize is the size of one range request; <= 0 means 8 MiB.
	BlockSize int64
	// Readahead is how many blocks each open file fetches ahead of its
	// reader; < 0 means none, 0 means 4.
	Readahead int
	// Buffer bounds the bytes of blocks fetched ahead, over all files;
	// <= 0 means 256 MiB. The block a reader waits for is always fetched.
	Buffer int64
	// OCI says how an oci:// source's registry is reached (TLS, plain
	// HTTP); UserAgent and Limiter above apply to it too.
	OCI oci.Options
}

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = 16
	}
	if o.BlockSize <= 0 {
		o.BlockSize = 8 << 20
	}
	if o.Readahead == 0 {
		o.Readahead = 4
	}
	if o.Readahead < 0 {
		o.Readahead = 0
	}
	if o.Buffer <= 0 {
		o.Buffer = 256 << 20
	}
	return o
}

// Open returns the source that uri names:
//
//	hf://ORG/REPO[@REVISION]          a Hugging Face model repository
//	hf://datasets/ORG/REPO[@REVISION] a Hugging Face dataset repository
//	s3://BUCKET[/PREFIX]              the objects under an S3 prefix
//	gs://BUCKET[/PREFIX]              the objects under a GCS prefix
//	https://HOST/PATH                 one file (a list of URLs with List)
//	oci://HOST/REPO[:TAG][@DIGEST]    a ModelPack artifact or OCI image in a registry
//	oci:PATH[:TAG][@DIGEST]           the same in an OCI layout
//
// Open checks the URI and sets up clients; it does not contact the source
// (Walk does).
func Open(ctx context.Context, uri string, opt Options) (Source, error) {
	opt = opt.withDefaults()
	f, err := pathglob.New(opt.Include, opt.Exclude)
	if err != nil {
		return nil, err
	}
	if isOCI(uri) {
		return newOCI(uri, opt, f)
	}
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return nil, fmt.Errorf("%w %q: want hf://, s3://, gs://, http://, https://, oci:// or oci:PATH", ErrUnsupported, uri)
	}
	var b backend
	switch strings.ToLower(scheme) {
	case "hf":
		b, err = newHub(rest, opt)
	case "s3":
		b, err = newS3(ctx, rest, opt)
	case "gs":
		b, err = newGCS(rest, opt)
	case "http", "https":
		b, err = newWeb(uri, opt)
	default:
		return nil, fmt.Errorf("%w %q: unknown scheme %q", ErrUnsupported, uri, scheme)
	}
	if err != nil {
		return nil, err
	}
	return &remote{
		b:      b,
		opt:    opt,
		filter: f,
		reqs:   semaphore.NewWeighted(int64(opt.Concurrency)),
		buffer: semaphore.NewWeighted(opt.Buffer),
	}, nil
}

// object is one file of a source, as its backend lists it.
type object struct {
	path string // slash path in the volume
	size int64
	want expectation
	key  string // the backend's name for it (object key, URL)
	gen  string // backend version pin (GCS generation), if any
	id   string // the store's identifier of the object's bytes, if any (identity.go)

	mu  sync.Mutex
	loc string // where a redirect last led, reused for later ranges
}

// backend is what each kind of store implements.
type backend interface {
	// list lists every file of the source.
	list(ctx context.Context) ([]*object, error)
	// get returns exactly n bytes of o from off.
	get(ctx context.Context, o *object, off, n int64) ([]byte, error)
	// revision returns what list resolved the source to, if anything.
	revision() string
	// scope names the store whose identifiers list sets, or "" when it
	// sets none.
	scope() string
	// String names the source without credentials.
	String() string
}

// remote adapts a backend to push.Source.
type remote struct {
	b      backend
	opt    Options
	filter *pathglob.Filter
	reqs   *semaphore.Weighted // range requests in flight
	buffer *semaphore.Weighted // readahead bytes held

	mu    sync.Mutex
	files map[string]*object
}

var _ Source = (*remote)(nil)

func (r *remote) String() string   { return r.b.String() }
func (r *remote) Remote() bool     { return true }
func (r *remote) Revision() string { return r.b.revision() }

// Walk lists the source, applies the filters, and returns the files with
// the directories that hold them, sorted by path.
func (r *remote) Walk(ctx context.Context) ([]push.Entry, error) {
	objs, err := r.b.list(ctx)
	if err != nil {
		return nil, err
	}
	files := map[string]*object{}
	dirs := map[string]bool{}
	for _, o := range objs {
		if !r.filter.Match(o.path) {
			continue
		}
		if err := checkSize(o.size); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", r.b, o.key, err)
		}
		if o.path == "." || !fs.ValidPath(o.path) {
			return nil, fmt.Errorf("%s: %q: %w: not a safe relative path", r.b, o.key, ErrUnsupported)
		}
		if _, dup := files[o.path]; dup {
			return nil, fmt.Errorf("%s: %q: listed twice", r.b, o.path)
		}
		files[o.path] = o
		for p := parent(o.path); p != ""; p = parent(p) {
			dirs[p] = true
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: %w", r.b, ErrEmpty)
	}
	out := make([]push.Entry, 0, len(files)+len(dirs))
	for d := range dirs {
		if o, clash := files[d]; clash {
			return nil, fmt.Errorf("%s: %q is both a file and a directory", r.b, o.path)
		}
		out = append(out, push.Entry{Path: d, Type: layout.TypeDir, Mode: 0o755})
	}
	for p, o := range files {
		e := push.Entry{Path: p, Type: layout.TypeFile, Mode: 0o644, Size: o.size, Stat: statcache.Key{Size: o.size}}
		if o.want.algo == algoSHA256 {
			// A file's SHA-256 is its digest in the index: a push may
			// match it with a file of the previous version.
			e.Digest = digest.NewDigestFromEncoded(digest.SHA256, o.want.hex)
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	r.mu.Lock()
	r.files = files
	r.mu.Unlock()
	return out, nil
}

// Open returns a reader of the file at p that fetches ranges on demand and
// verifies the whole file as it is read in order.
func (r *remote) Open(ctx context.Context, p string) (push.ReadAtCloser, error) {
	r.mu.Lock()
	o := r.files[p]
	r.mu.Unlock()
	if o == nil {
		return nil, fmt.Errorf("%s: %s: %w (not listed by the walk)", r.b, p, ErrNotFound)
	}
	ctx, cancel := context.WithCancel(ctx)
	br := &blockReader{
		ctx: ctx, cancel: cancel, size: o.size, bs: r.opt.BlockSize, ahead: r.opt.Readahead,
		reqs: r.reqs, buffer: r.buffer, blocks: map[int64]*block{},
		fetch: func(ctx context.Context, off, n int64) ([]byte, error) {
			return retry(ctx, func() ([]byte, error) { return r.b.get(ctx, o, off, n) })
		},
		name: fmt.Sprintf("%s: %s", r.b, p),
	}
	return newVerifier(br, o.size, o.want, r.b.String(), p), nil
}

// Verify compares the file digests of a pushed index with the SHA-256
// digests the source gave for its files, a second check on top of the one
// made while reading (for an OCI source, it first completes the check of
// every layer against its digest). It returns an error naming every file
// that differs.
func Verify(ctx context.Context, s Source, x *layout.Index) error {
	if o, ok := s.(*ociSource); ok {
		return o.verifyIndex(ctx, x)
	}
	r, ok := s.(*remote)
	if !ok {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var bad []string
	for fi := range x.Len() {
		f := x.File(fi)
		o := r.files[f.Path]
		if f.Type != layout.TypeFile || o == nil || o.want.algo != algoSHA256 {
			continue
		}
		want := digest.NewDigestFromEncoded(digest.SHA256, o.want.hex)
		if f.Digest != want {
			bad = append(bad, fmt.Sprintf("%s (want %s, got %s)", f.Path, want, f.Digest))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s: %w: %s", r.b, ErrDigestMismatch, strings.Join(bad, ", "))
	}
	return nil
}

// MaxFileSize is the largest file a source may list (1 PiB): sizes come
// from the source, and a negative or absurd one must fail the sync, not
// the allocation of a block.
const MaxFileSize = 1 << 50

// checkSize refuses a size a source gave that no file can have.
func checkSize(n int64) error {
	if n < 0 || n > MaxFileSize {
		return fmt.Errorf("size %d is out of range", n)
	}
	return nil
}

func parent(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}

// redactURL drops the user info, query and fragment of a URL, which may
// carry credentials (signed URLs), for errors and logs.
func redactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	c := *u
	c.User, c.RawQuery, c.Fragment, c.ForceQuery = nil, "", "", false
	return c.String()
}
