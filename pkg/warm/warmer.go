package warm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/internal/ratelimit"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// The states of a warm list entry.
const (
	StateResolving = "resolving"
	StateWarming   = "warming"
	StateWarm      = "warm"
	StateNoFit     = "does-not-fit"
	StateError     = "error"
)

// EntryStatus is the state of one warm list entry on this node.
type EntryStatus struct {
	Ref      string    `json:"ref"`
	Pinned   string    `json:"pinned,omitempty"` // the version the reference names now
	Digest   string    `json:"digest,omitempty"`
	State    string    `json:"state"`
	Bytes    int64     `json:"bytes"`  // what the entry needs
	Cached   int64     `json:"cached"` // of which in the cache
	Error    string    `json:"error,omitempty"`
	Resolved time.Time `json:"resolved,omitzero"`
}

// Status is a node's warm status: the file and endpoint the plugin serves.
type Status struct {
	Updated    time.Time     `json:"updated"`
	List       string        `json:"list"`
	CacheBytes int64         `json:"cache_bytes"`
	CacheMax   int64         `json:"cache_max"`
	Fits       bool          `json:"fits"` // every entry fits in the cache with the mounted versions
	Entries    []EntryStatus `json:"entries"`
}

// WarmerOptions configure a Warmer.
type WarmerOptions struct {
	Options
	Cache      *chunkcache.Cache
	ListFile   string // the warm list (a ConfigMap key mounted as a file)
	StatusFile string // where the status is written; "" for none
	// Bandwidth bounds the bytes per second fetched for warming; <= 0 for none.
	Bandwidth int64
	// ResolveInterval is how often tags are resolved again (default 5m).
	ResolveInterval time.Duration
	// Poll is how often the list file is checked for changes (default 2s).
	Poll   time.Duration
	Jobs   int // concurrent fetches
	Logger *slog.Logger
}

// ownerPrefix marks the cache protect sets of warm list entries.
const ownerPrefix = "warm:"

// Warmer keeps the references of a warm list in the cache.
type Warmer struct {
	opt     WarmerOptions
	log     *slog.Logger
	limiter *ratelimit.Limiter
	status  atomic.Pointer[Status]

	mu     sync.Mutex
	owners map[string]bool // protect sets this warmer holds
	told   map[string]string
}

// NewWarmer returns a warmer; Run starts it.
func NewWarmer(opt WarmerOptions) *Warmer {
	if opt.ResolveInterval <= 0 {
		opt.ResolveInterval = 5 * time.Minute
	}
	if opt.Poll <= 0 {
		opt.Poll = 2 * time.Second
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Warmer{opt: opt, log: opt.Logger, limiter: ratelimit.New(opt.Bandwidth), owners: map[string]bool{}, told: map[string]string{}}
	w.status.Store(&Status{List: opt.ListFile, CacheMax: opt.Cache.Max(), Fits: true})
	return w
}

// Status returns the latest status.
func (w *Warmer) Status() Status { return *w.status.Load() }

// Handler serves the status as JSON.
func (w *Warmer) Handler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		json.NewEncoder(rw).Encode(w.Status())
	})
}

// listStamp identifies a version of the list file.
type listStamp struct {
	mod  time.Time
	size int64
	ok   bool
}

func (w *Warmer) stamp() listStamp {
	st, err := os.Stat(w.opt.ListFile)
	if err != nil {
		return listStamp{}
	}
	return listStamp{st.ModTime(), st.Size(), true}
}

// Run warms until ctx ends: a round on start, whenever the list file
// changes (a running round is cancelled and started again), and every
// ResolveInterval (tags resolved again).
func (w *Warmer) Run(ctx context.Context) error {
	last := listStamp{}
	lastRound := time.Time{}
	first := true
	for {
		cur := w.stamp()
		if first || cur != last || time.Since(lastRound) >= w.opt.ResolveInterval {
			first, last, lastRound = false, cur, time.Now()
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				w.round(rctx)
			}()
			w.watch(rctx, cancel, cur, done)
			<-done
			cancel()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(w.opt.Poll):
		}
	}
}

// watch cancels a round when the list changes, returning when it ends.
func (w *Warmer) watch(ctx context.Context, cancel context.CancelFunc, at listStamp, done <-chan struct{}) {
	t := time.NewTicker(w.opt.Poll)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			if w.stamp() != at {
				w.log.Info("warm list changed", "list", w.opt.ListFile)
				cancel()
				return
			}
		}
	}
}

// ErrLayoutRefused is the error of a warm list entry naming a local
// layout: the mounter runs as root and would read a node directory.
var ErrLayoutRefused = errors.New("oci: layouts are refused in the warm list (the mounter would read a node directory as root); name a registry repository")

// open opens a list entry: a registry reference only.
func (w *Warmer) open(ctx context.Context, e ListEntry) (*Opened, error) {
	if r, err := oci.ParseRef(e.Ref); err == nil && r.Layout != "" || strings.HasPrefix(e.Ref, "oci:") {
		return nil, ErrLayoutRefused
	}
	return Open(ctx, w.opt.Cache, e.Ref, e.Patterns, w.opt.Options)
}

// round resolves the list, decides what fits, protects it and fills it.
func (w *Warmer) round(ctx context.Context) {
	b, err := os.ReadFile(w.opt.ListFile)
	var list []ListEntry
	if err == nil {
		list, err = ParseList(b)
	}
	if err != nil && !os.IsNotExist(err) {
		w.log.Error("warm list unreadable", "list", w.opt.ListFile, "error", err.Error())
		return // keep what is warm; do not drop protection on a bad edit
	}
	c := w.opt.Cache
	st := &Status{List: w.opt.ListFile, CacheMax: c.Max(), Fits: true}
	targets := make([]*Opened, len(list))
	defer func() {
		for _, t := range targets {
			if t != nil {
				t.Close()
			}
		}
	}()
	for i, e := range list {
		es := EntryStatus{Ref: e.Ref, State: StateResolving}
		t, err := w.open(ctx, e)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			es.State, es.Error = StateError, err.Error()
			w.tell(e.Ref, "error "+err.Error(), func() { w.log.Warn("warm entry failed", "ref", e.Ref, "error", err.Error()) })
			// Keep the protection of what it named before: a registry
			// outage must not let the cache evict a warm version.
			st.Entries = append(st.Entries, es)
			continue
		}
		targets[i] = t
		es.Pinned, es.Digest, es.Bytes, es.Resolved = t.Pinned, t.Digest().String(), t.Bytes(), time.Now().UTC()
		st.Entries = append(st.Entries, es)
	}
	// The order: mounted versions first, then the entries in list order while
	// they fit. An entry that does not fit is not warmed at all (warming
	// part of it would evict another's chunks round after round).
	need := c.Protected(func(o string) bool { return !strings.HasPrefix(o, ownerPrefix) })
	keepOwners := map[string]bool{}
	for i, t := range targets {
		es := &st.Entries[i]
		owner := ownerPrefix + es.Ref
		if t == nil {
			if es.State == StateError {
				keepOwners[owner] = true
			}
			continue
		}
		add := map[digest.Digest]int64{}
		for _, d := range t.Need {
			if _, ok := need[d.Digest]; !ok {
				add[d.Digest] = d.Size
			}
		}
		if total(need)+total(add) > c.Max() {
			es.State = StateNoFit
			es.Error = fmt.Sprintf("needs %d bytes; the cache holds %d, of which %d are taken by mounted versions and entries above", t.Bytes(), c.Max(), total(need))
			st.Fits = false
			w.tell(es.Ref, "nofit "+es.Digest, func() {
				w.log.Warn("warm entry does not fit", "ref", es.Ref, "digest", es.Digest, "bytes", t.Bytes(), "cache_max", c.Max(), "taken", total(need))
			})
			continue
		}
		for d, n := range add {
			need[d] = n
		}
		c.Protect(owner, t.Need)
		keepOwners[owner] = true
		es.State = StateWarming
	}
	w.mu.Lock()
	for o := range w.owners {
		if !keepOwners[o] {
			c.Unprotect(o)
			delete(w.owners, o)
		}
	}
	for o := range keepOwners {
		w.owners[o] = true
	}
	w.mu.Unlock()
	for i := range st.Entries {
		st.Entries[i].Cached, _ = cachedOf(c, targets[i])
	}
	w.publish(st)
	for i, t := range targets {
		if t == nil || st.Entries[i].State != StateWarming {
			continue
		}
		start := time.Now()
		var cached atomic.Int64
		before, _ := Cached(c, t.Need)
		err := t.Fill(ctx, c, FillOptions{Jobs: w.opt.Jobs, Limiter: w.limiter, Progress: func(n int64) { cached.Add(n) }})
		if ctx.Err() != nil {
			return
		}
		es := st.Entries[i]
		var missing int
		es.Cached, missing = Cached(c, t.Need)
		switch {
		case err == nil && missing == 0:
			es.State, es.Error = StateWarm, ""
			rec := t.Record()
			rec.Warmed = time.Now().UTC()
			if old, err := StoreOf(c).Get(t.Digest()); err == nil {
				rec.Used = old.Used
			}
			StoreOf(c).Put(rec)
			w.tell(es.Ref, "warm "+es.Digest, func() {
				w.log.Info("warm", "ref", es.Ref, "digest", es.Digest, "bytes", es.Bytes,
					"fetched", es.Cached-before, "ms", time.Since(start).Milliseconds())
			})
		case err != nil:
			es.State, es.Error = StateError, err.Error()
			w.log.Warn("warming failed", "ref", es.Ref, "digest", es.Digest, "error", err.Error())
		default:
			es.State, es.Error = StateError, fmt.Sprintf("%d chunks missing", missing)
		}
		st = cloneWith(st, i, es)
		w.publish(st)
	}
	w.publish(st)
}

func cachedOf(c *chunkcache.Cache, t *Opened) (int64, int) {
	if t == nil {
		return 0, 0
	}
	return Cached(c.For(t.origin), t.Need)
}

func cloneWith(st *Status, i int, es EntryStatus) *Status {
	n := *st
	n.Entries = append([]EntryStatus(nil), st.Entries...)
	n.Entries[i] = es
	return &n
}

// tell runs log once per distinct (ref, what).
func (w *Warmer) tell(ref, what string, log func()) {
	w.mu.Lock()
	same := w.told[ref] == what
	w.told[ref] = what
	w.mu.Unlock()
	if !same {
		log()
	}
}

// publish makes st the current status and writes the status file.
func (w *Warmer) publish(st *Status) {
	n := *st
	n.Entries = append([]EntryStatus(nil), st.Entries...)
	n.Updated = time.Now().UTC()
	n.CacheBytes = w.opt.Cache.Size()
	w.status.Store(&n)
	if w.opt.StatusFile == "" {
		return
	}
	b, _ := json.MarshalIndent(&n, "", "  ")
	if err := writeAtomic(w.opt.StatusFile, append(b, '\n')); err != nil {
		w.log.Warn("warm status not written", "path", w.opt.StatusFile, "error", err.Error())
	}
}

func writeAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, b, 0o600)
}
