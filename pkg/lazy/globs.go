package lazy

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"sync/atomic"
)

// Bounds of a list of prefetch patterns: the list comes from whoever asks
// for a mount (a pod's volume attribute), and its matching runs in the
// process that serves every mount.
const (
	MaxGlobs     = 256  // patterns in one list
	MaxGlobBytes = 1024 // bytes of one pattern
	// GlobBudget is the work one Globs may do, in the units of its cost
	// model (about a byte compared each): under a CPU-second; each path
	// matched adds GlobAllowance, so that a version of many files is not
	// cut short by patterns that cost little per file.
	GlobBudget    = 1 << 26
	GlobAllowance = 1 << 12
)

// ErrGlobBudget is returned by Globs.Err once the patterns used up their
// work budget; later paths did not match.
var ErrGlobBudget = errors.New("prefetch patterns used up their work budget; the remaining files are read on demand")

// Globs matches paths against comma-separated path.Match patterns, each
// validated once: a pattern with a slash matches the whole path, one
// without matches the base name. Its total work is bounded by GlobBudget.
type Globs struct {
	pats []glob
	left atomic.Int64
}

// glob is one validated pattern.
type glob struct {
	p       string
	slash   bool  // matched against the whole path, else the base name
	literal bool  // no metacharacter: a string comparison
	weight  int64 // cost per byte of name: 1 + bytes that follow a star
}

// ParseGlobs validates the comma-separated patterns in s: at most MaxGlobs
// distinct ones of at most MaxGlobBytes each, in path.Match syntax.
func ParseGlobs(s string) (*Globs, error) {
	if len(s) > MaxGlobs*(MaxGlobBytes+2) {
		return nil, fmt.Errorf("prefetch patterns: %d bytes, more than %d patterns of %d bytes can take", len(s), MaxGlobs, MaxGlobBytes)
	}
	g := &Globs{}
	g.left.Store(GlobBudget)
	seen := map[string]bool{}
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p == "" || seen[p] {
			continue
		}
		if len(p) > MaxGlobBytes {
			return nil, fmt.Errorf("prefetch pattern %.40q...: %d bytes, more than %d", p, len(p), MaxGlobBytes)
		}
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("prefetch pattern %.64q: %w", p, err)
		}
		if seen[p] = true; len(seen) > MaxGlobs {
			return nil, fmt.Errorf("prefetch patterns: more than %d", MaxGlobs)
		}
		g.pats = append(g.pats, compileGlob(p))
	}
	return g, nil
}

func compileGlob(p string) glob {
	gl := glob{p: p, slash: strings.Contains(p, "/"), literal: !strings.ContainsAny(p, `*?[\`), weight: 1}
	star := false
	for i := 0; i < len(p); i++ {
		switch {
		case p[i] == '*':
			star = true
		case star:
			gl.weight++
		}
	}
	return gl
}

// Match reports whether any pattern matches name. Once the budget is used
// up it matches nothing and Err says so.
func (g *Globs) Match(name string) bool {
	if g.left.Add(GlobAllowance) <= GlobAllowance {
		g.left.Add(-GlobAllowance) // used up already: stays so
		return false
	}
	base := path.Base(name)
	for _, p := range g.pats {
		s := base
		if p.slash {
			s = name
		}
		// A star may make path.Match try every position of s with the
		// bytes after it: charge for that, not for the typical case.
		if g.left.Add(-(int64(len(p.p)) + int64(len(s))*p.weight)) < 0 {
			return false
		}
		if p.literal {
			if s == p.p {
				return true
			}
			continue
		}
		if ok, _ := path.Match(p.p, s); ok {
			return true
		}
	}
	return false
}

// Err is ErrGlobBudget once the budget is used up, else nil.
func (g *Globs) Err() error {
	if g.left.Load() < 0 {
		return ErrGlobBudget
	}
	return nil
}

// MatchGlobs returns Globs.Match of ParseGlobs(patterns), for Prefetch.
func MatchGlobs(patterns string) (func(string) bool, error) {
	g, err := ParseGlobs(patterns)
	if err != nil {
		return nil, err
	}
	return g.Match, nil
}
