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

// WarmstatePrefix starts the second field of a warm list line that names
// a warm-state companion instead of files: `REF warmstate:KEY`.
const WarmstatePrefix = "warmstate:"

// CompanionEntry is a warm list line `REF warmstate:KEY`: the warm-state
// companion of the key for the version REF names, which the CSI node
// plugin keeps on its node (docs/warm-state.md); the mounter skips it.
type CompanionEntry struct {
	Ref string `json:"ref"`
	Key string `json:"key"` // as written; the node plugin parses it
}

// ParseCompanions reads the `REF warmstate:KEY` lines of a warm list, in
// order, the same line twice once. A malformed line fails, naming it.
func ParseCompanions(b []byte) ([]CompanionEntry, error) {
	var out []CompanionEntry
	seen := map[CompanionEntry]bool{}
	err := eachLine(b, func(n int, line string, f []string) error {
		if len(f) != 2 || !strings.HasPrefix(f[1], WarmstatePrefix) {
			return nil
		}
		e := CompanionEntry{Ref: f[0], Key: strings.TrimPrefix(f[1], WarmstatePrefix)}
		if e.Key == "" {
			return fmt.Errorf("warm list line %d %q: want REF warmstate:KEY", n, line)
		}
		if !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// eachLine calls fn with each line of a warm list that is not blank or a
// comment, its number and its fields; more than two fields fail.
func eachLine(b []byte, fn func(n int, line string, f []string) error) error {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) > 2 {
			return fmt.Errorf("warm list line %d %q: want REF [GLOBS] or REF warmstate:KEY", n, line)
		}
		if err := fn(n, line, f); err != nil {
			return err
		}
	}
	return sc.Err()
}

// ParseList reads a warm list: one `REF [GLOBS]` per line, blank lines and
// lines starting with # ignored, and `REF warmstate:KEY` lines left to
// ParseCompanions. Entries keep their order, which is their priority when
// the list does not fit. A malformed line fails, naming it.
func ParseList(b []byte) ([]ListEntry, error) {
	var out []ListEntry
	seen := map[string]bool{}
	err := eachLine(b, func(_ int, _ string, f []string) error {
		if len(f) == 2 && strings.HasPrefix(f[1], WarmstatePrefix) {
			return nil
		}
		e := ListEntry{Ref: f[0]}
		if len(f) == 2 && f[1] != "all" {
			e.Patterns = f[1]
		}
		if !seen[e.Ref] {
			seen[e.Ref] = true
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
