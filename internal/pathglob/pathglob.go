// Package pathglob selects slash-separated paths by --include and
// --exclude globs: the one glob syntax of sync and pull.
package pathglob

import (
	"fmt"
	"regexp"
	"strings"
)

// Filter selects paths by --include and --exclude globs, as `hf download`
// does with --include/--exclude: a path is kept when it matches an include
// (or there are none) and matches no exclude. In a glob, * and ? match any
// characters including "/", [...] is a class, and a trailing "/" matches
// everything below a directory. A nil Filter keeps every path.
type Filter struct {
	include, exclude []*regexp.Regexp
}

// New compiles the include and exclude globs; a malformed one is an error
// that names it.
func New(include, exclude []string) (*Filter, error) {
	f := &Filter{}
	for _, set := range []struct {
		globs []string
		out   *[]*regexp.Regexp
	}{{include, &f.include}, {exclude, &f.exclude}} {
		for _, g := range set.globs {
			re, err := globRegexp(g)
			if err != nil {
				return nil, err
			}
			*set.out = append(*set.out, re)
		}
	}
	return f, nil
}

// Match reports whether the path p is kept.
func (f *Filter) Match(p string) bool {
	if f == nil {
		return true
	}
	if len(f.include) > 0 && !anyMatch(f.include, p) {
		return false
	}
	return !anyMatch(f.exclude, p)
}

// All reports whether f keeps every path (nil, or no globs at all).
func (f *Filter) All() bool { return f == nil || len(f.include)+len(f.exclude) == 0 }

func anyMatch(res []*regexp.Regexp, p string) bool {
	for _, re := range res {
		if re.MatchString(p) {
			return true
		}
	}
	return false
}

// globRegexp compiles a glob to an anchored regular expression.
func globRegexp(g string) (*regexp.Regexp, error) {
	if g == "" {
		return nil, fmt.Errorf("empty glob")
	}
	if strings.HasSuffix(g, "/") {
		g += "*"
	}
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(g); i++ {
		switch c := g[i]; c {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		case '[':
			j := strings.IndexByte(g[i+1:], ']')
			if j < 0 {
				return nil, fmt.Errorf("glob %q: unclosed [", g)
			}
			class := g[i+1 : i+1+j]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += j + 1
		case '\\':
			if i+1 < len(g) {
				i++
				b.WriteString(regexp.QuoteMeta(g[i : i+1]))
			}
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	re, err := regexp.Compile(b.String())
	if err != nil {
		return nil, fmt.Errorf("glob %q: %v", g, err)
	}
	return re, nil
}
