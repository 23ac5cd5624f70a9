package peer

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// DefaultMaxServing bounds the requests a Server serves at once.
const DefaultMaxServing = 64

// Server serves the chunks of a node's cache to its peers:
// GET /v2/<repository>/blobs/<digest>?ns=<registry>&size=<bytes>. It
// serves a chunk only from the cache's view of that origin (what the
// origin delivered), and, when this node owns the chunk and serves a mount
// of the origin whose version lists it, fetches it from the origin once
// first. Everything else
// is 404; more than MaxServing requests at once are 503.
type Server struct {
	Cache *chunkcache.Cache
	Ring  *Ring
	// MaxServing bounds the requests served at once; <= 0 means
	// DefaultMaxServing.
	MaxServing int
	// AwaitUntil, when set, is when this node stops holding a request for
	// an origin that no mount serves yet until one does (a `bdnvol pull`
	// that has just started: its peers ask before it has read the
	// manifest); after it such a request is refused at once.
	AwaitUntil time.Time

	mu      sync.Mutex
	origins map[string][]*served // origin -> its mounts' sources, while they are served
	changed chan struct{}        // closed when a source is added

	serving atomic.Int64
	last    atomic.Int64 // time.Now().UnixNano() of the last request
	stats   serverStats
}

// LastRequest returns when the last request came (the zero time if none).
func (s *Server) LastRequest() time.Time {
	if n := s.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

type serverStats struct {
	served, servedBytes, fetched, refused atomic.Int64
}

// ServerStats count what a Server did.
type ServerStats struct {
	Served      int64 // chunks served to peers
	ServedBytes int64
	Fetched     int64 // chunks this node fetched from an origin as their owner, for a peer
	Refused     int64 // requests refused: not held, no such origin here, busy, malformed
}

// Stats returns the counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{Served: s.stats.served.Load(), ServedBytes: s.stats.servedBytes.Load(),
		Fetched: s.stats.fetched.Load(), Refused: s.stats.refused.Load()}
}

// Serve records src as a source of origin ("host/repository") while a
// mount of it is open on this node, so that this node fetches from it the
// chunks it owns, and known reports (the chunks of the versions the mount
// opened: never a digest a peer names that no manifest read here lists),
// for its peers. The returned function withdraws it (once; later calls do
// nothing). Several mounts of one origin each add theirs: the latest one
// that knows a chunk fetches it.
func (s *Server) Serve(origin string, src content.Fetcher, known func(digest.Digest) bool) (withdraw func()) {
	e := &served{src: src, known: known}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.origins == nil {
		s.origins = map[string][]*served{}
	}
	s.origins[origin] = append(s.origins[origin], e)
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			es := slices.DeleteFunc(s.origins[origin], func(x *served) bool { return x == e })
			if len(es) == 0 {
				delete(s.origins, origin)
			} else {
				s.origins[origin] = es
			}
		})
	}
}

// served is one mount's source of an origin.
type served struct {
	src   content.Fetcher
	known func(digest.Digest) bool
}

// source returns the source of origin that fetches d for a peer: the
// latest mount of origin whose versions list d; nil if none.
func (s *Server) source(origin string, d digest.Digest) content.Fetcher {
	s.mu.Lock()
	es := slices.Clone(s.origins[origin])
	s.mu.Unlock()
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].known != nil && es[i].known(d) {
			return es[i].src
		}
	}
	return nil
}

// awaitSource is source, except that until s.AwaitUntil a request for an
// origin no mount serves yet waits for one (a node that has just started
// is about to open the version its peers are reading).
func (s *Server) awaitSource(ctx context.Context, origin string, d digest.Digest) content.Fetcher {
	for {
		if src := s.source(origin, d); src != nil {
			return src
		}
		left := time.Until(s.AwaitUntil)
		s.mu.Lock()
		_, served := s.origins[origin]
		if served || left <= 0 {
			s.mu.Unlock()
			return nil
		}
		wait := s.changed
		if wait == nil {
			wait = make(chan struct{})
			s.changed = wait
		}
		s.mu.Unlock()
		t := time.NewTimer(left)
		select {
		case <-wait:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// ServeHTTP answers one blob request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.last.Store(time.Now().UnixNano())
	max := s.MaxServing
	if max <= 0 {
		max = DefaultMaxServing
	}
	if s.serving.Add(1) > int64(max) {
		s.serving.Add(-1)
		s.refuse(w, http.StatusServiceUnavailable, "busy")
		return
	}
	defer s.serving.Add(-1)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		s.refuse(w, http.StatusMethodNotAllowed, "GET only")
		return
	}
	origin, desc, ok := parseRequest(r)
	if !ok {
		s.refuse(w, http.StatusNotFound, "not a chunk request")
		return
	}
	view := s.Cache.For(origin)
	var src content.Fetcher = absent{}
	if !view.Contains(desc.Digest) {
		owners := s.Ring.Owners(desc.Digest)
		if len(owners) == 0 || owners[0] != s.Ring.Self() {
			s.refuse(w, http.StatusNotFound, "not held, and not its owner")
			return
		}
		if src = s.awaitSource(r.Context(), origin, desc.Digest); src == nil {
			// The asker fetches it from its own source now: when this
			// node needs it later, it asks the asker first.
			s.Ring.Hint(desc.Digest, r.Header.Get(HeaderFrom))
			s.refuse(w, http.StatusNotFound, "not held, and no mount here of a version of its origin that lists it")
			return
		}
	}
	fetchedBefore := s.Cache.Stats().Fetches
	ch, err := view.Load(r.Context(), src, desc)
	if err != nil {
		s.refuse(w, http.StatusNotFound, err.Error())
		return
	}
	defer ch.Close()
	if s.Cache.Stats().Fetches > fetchedBefore {
		s.stats.fetched.Add(1)
	}
	s.stats.served.Add(1)
	s.stats.servedBytes.Add(desc.Size)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", desc.Digest.String())
	w.Header().Set("Content-Length", strconv.FormatInt(desc.Size, 10))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		io.Copy(w, io.NewSectionReader(ch, 0, desc.Size))
	}
}

func (s *Server) refuse(w http.ResponseWriter, code int, why string) {
	s.stats.refused.Add(1)
	http.Error(w, why, code)
}

// parseRequest reads the origin and the chunk asked for from r.
func parseRequest(r *http.Request) (string, ocispec.Descriptor, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v2/")
	if !ok {
		return "", ocispec.Descriptor{}, false
	}
	repo, dg, ok := strings.Cut(rest, "/blobs/")
	d, err := digest.Parse(dg)
	q := r.URL.Query()
	ns := q.Get("ns")
	size, serr := strconv.ParseInt(q.Get("size"), 10, 64)
	if !ok || err != nil || d.Algorithm() != digest.SHA256 || repo == "" || ns == "" ||
		strings.ContainsAny(ns, "/?#") || serr != nil || size < 0 || size > layout.MaxChunkBytes {
		return "", ocispec.Descriptor{}, false
	}
	return ns + "/" + repo, ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: d, Size: size}, true
}

// absent is the source of a chunk the cache holds: it has nothing else.
type absent struct{}

func (absent) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return nil, errNotHeld
}

var errNotHeld = errors.New("not held")
