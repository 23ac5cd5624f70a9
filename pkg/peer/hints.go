package peer

import (
	"slices"
	"time"

	"github.com/opencontainers/go-digest"
)

// HeaderFrom names, on a request to a peer, the asking node's own address
// (as the ring lists it).
const HeaderFrom = "Bdnvol-Peer-From"

// maxHints bounds the hints a ring keeps (the oldest go first), and
// hintTTL is how long one is used.
const (
	maxHints = 1 << 14
	hintTTL  = 10 * time.Minute
)

// hint is a peer that asked this node for a chunk this node owns before
// this node could fetch it: that peer then fetched it from its own source.
type hint struct {
	addr string
	at   time.Time
}

// Hint records that member addr asked for d, which this node owns, while
// this node could not fetch it (no mount here of a version listing it):
// addr fetched d itself, so this node asks addr first when it needs d (its
// own mount opening later), instead of the registry. addr must be a member
// other than this node; the hints are bounded.
func (r *Ring) Hint(d digest.Digest, addr string) {
	if addr == r.self {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.peers, addr) {
		return
	}
	if r.hints == nil {
		r.hints = map[digest.Digest]hint{}
	}
	if _, ok := r.hints[d]; !ok {
		if len(r.hintOrder) >= maxHints {
			delete(r.hints, r.hintOrder[0])
			r.hintOrder = r.hintOrder[1:]
		}
		r.hintOrder = append(r.hintOrder, d)
	}
	r.hints[d] = hint{addr: addr, at: time.Now()}
}

// Hinted returns the member that fetched d itself after asking this node
// for it (see Hint), "" if none is known, the hint is old, or the member is
// gone or skipped.
func (r *Ring) Hinted(d digest.Digest) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.hints[d]
	if !ok || time.Since(h.at) > hintTTL || !slices.Contains(r.peers, h.addr) {
		return ""
	}
	if until, ok := r.downUntil[h.addr]; ok && time.Now().Before(until) {
		return ""
	}
	return h.addr
}
