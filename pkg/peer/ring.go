package peer

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
)

// Ring is the membership a node routes by: the addresses (host:port) of
// the cluster's mounters, this node's own among them. It is safe for
// concurrent use.
type Ring struct {
	self string

	mu        sync.Mutex
	peers     []string
	downUntil map[string]time.Time
	strikes   map[string]int // connections refused in a row, per peer
	answered  map[string]bool
	awaitTill time.Time // see AwaitStart
	hints     map[digest.Digest]hint
	hintOrder []digest.Digest // the hints' digests, oldest first
}

// NewRing returns a ring whose own address is self.
func NewRing(self string) *Ring {
	return &Ring{self: self, downUntil: map[string]time.Time{}, strikes: map[string]int{}, answered: map[string]bool{}}
}

// Self returns this node's address.
func (r *Ring) Self() string { return r.self }

// Set replaces the membership with peers (this node's address may be
// among them or not: it is always a member).
func (r *Ring) Set(peers []string) {
	ps := slices.Clone(peers)
	if !slices.Contains(ps, r.self) {
		ps = append(ps, r.self)
	}
	slices.Sort(ps)
	ps = slices.Compact(ps)
	r.mu.Lock()
	r.peers = ps
	r.mu.Unlock()
}

// Members returns the membership, sorted.
func (r *Ring) Members() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.peers) == 0 {
		return []string{r.self}
	}
	return slices.Clone(r.peers)
}

// MarkDown skips addr when choosing owners for d.
func (r *Ring) MarkDown(addr string, d time.Duration) {
	if addr == r.self || d <= 0 {
		return
	}
	r.mu.Lock()
	r.downUntil[addr] = time.Now().Add(d)
	r.mu.Unlock()
}

// firstUnreachable is how long a peer that refused a connection once is
// skipped; each refusal in a row doubles it, up to the cooldown given.
const firstUnreachable = 250 * time.Millisecond

// MarkUnreachable skips addr, which could not be reached, for a time that
// starts short and doubles with each refusal in a row, up to max: a node
// still starting (or restarting) is asked again soon, one that is gone
// is asked rarely.
func (r *Ring) MarkUnreachable(addr string, max time.Duration) {
	if addr == r.self || max <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	d := firstUnreachable << min(r.strikes[addr], 16)
	r.strikes[addr]++
	r.downUntil[addr] = time.Now().Add(min(d, max))
}

// AwaitStart makes the peers that have not answered yet count as still
// starting until the time given: a connection one refuses is tried again
// shortly rather than skipped (nodes told to start together, as the pulls
// of a fleet are, start within a few seconds of one another, and a chunk
// fetched while its owner was starting would be fetched again by it).
func (r *Ring) AwaitStart(until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.awaitTill = until
}

// starting reports whether addr may still be starting (see AwaitStart).
func (r *Ring) starting(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.answered[addr] && time.Now().Before(r.awaitTill)
}

// MarkUp records that addr answered: its next refusal is skipped briefly
// again.
func (r *Ring) MarkUp(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.strikes, addr)
	r.answered[addr] = true
}

// Owners returns the members in the order they own d: rendezvous hashing
// of the digest with each address, highest first, the peers marked down
// left out (this node never is).
func (r *Ring) Owners(d digest.Digest) []string {
	now := time.Now()
	r.mu.Lock()
	ps := r.peers
	if len(ps) == 0 {
		ps = []string{r.self}
	}
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		if until, ok := r.downUntil[p]; ok && now.Before(until) {
			continue
		}
		out = append(out, p)
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b string) int {
		ha, hb := weight(d, a), weight(d, b)
		switch {
		case ha > hb:
			return -1
		case ha < hb:
			return 1
		}
		return 0
	})
	return out
}

// weight is the rendezvous weight of member addr for d.
func weight(d digest.Digest, addr string) uint64 {
	h := sha256.New()
	h.Write([]byte(d))
	h.Write([]byte{0})
	h.Write([]byte(addr))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}
