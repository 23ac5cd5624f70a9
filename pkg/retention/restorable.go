package retention

import "github.com/opencontainers/go-digest"

// Restorable returns the deleted versions of ds that can be restored (not
// live again, not gone), each once, in the order of ds; never nil.
func Restorable(ds []Deleted) []Deleted {
	out := []Deleted{}
	seen := map[digest.Digest]bool{}
	for _, d := range ds {
		if !d.Live && !d.Gone && !seen[d.Digest] {
			seen[d.Digest] = true
			out = append(out, d)
		}
	}
	return out
}
