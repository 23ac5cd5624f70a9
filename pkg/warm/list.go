package warm

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// ListEntry is one line of a warm list: a reference and, optionally, the
// --prefetch-style globs of the files to keep warm (every file when empty).
type ListEntry struct {
	Ref      string `json:"ref"`
	Patterns string `json:"patterns,omitempty"`
}

// ParseList reads a warm list: one `REF [GLOBS]` per line, blank lines and
// lines starting with # ignored. Entries keep their order, which is their
// priority when the list does not fit. A malformed line fails, naming it.
func ParseList(b []byte) ([]ListEntry, error) {
	var out []ListEntry
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) > 2 {
			return nil, fmt.Errorf("warm list line %d %q: want REF [GLOBS]", n, line)
		}
		e := ListEntry{Ref: f[0]}
		if len(f) == 2 && f[1] != "all" {
			e.Patterns = f[1]
		}
		if seen[e.Ref] {
			continue
		}
		seen[e.Ref] = true
		out = append(out, e)
	}
	return out, sc.Err()
}
