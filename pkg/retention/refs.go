package retention

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/deploy"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// suffixRE matches what may follow a repository name in a reference: a
// tag, a digest, or both.
var suffixRE = regexp.MustCompile(`^(?::([A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?(?:@(sha256:[0-9a-f]{64}))?`)

// Scan returns the references to the repository repo in the text b (YAML,
// JSON, or any text), each with the Source name:LINE. It finds every
// occurrence of REPO@sha256:<hex>, REPO:TAG@sha256:<hex> and REPO:TAG in
// the text, wherever it is (inside a longer string, in an escaped JSON
// annotation, in a comment), and, through the YAML parser, string values
// such as oci:relative/path@sha256:… that name the repository in another
// spelling; and each warm-state volume (a warmstateKey beside a ref of the
// repository) once more, with its key. A repository name is matched literally: localhost:5000 and
// 127.0.0.1:5000 are different registries.
func Scan(repo oci.Ref, name string, b []byte) []Reference {
	want := repo.Repo()
	var out []Reference
	seen := map[string]bool{}
	add := func(line int, ref, tag string, d digest.Digest) {
		key := fmt.Sprint(line, "\x00", ref)
		if seen[key] {
			return
		}
		seen[key] = true
		out = append(out, Reference{Source: fmt.Sprintf("%s:%d", name, line), Ref: ref, Digest: d, Tag: tag})
	}
	for i, line := range strings.Split(string(b), "\n") {
		for off := 0; ; {
			j := strings.Index(line[off:], want)
			if j < 0 {
				break
			}
			start := off + j
			off = start + len(want)
			if start > 0 && isRefByte(line[start-1]) {
				continue
			}
			m := suffixRE.FindStringSubmatch(line[off:])
			if m[0] == "" {
				continue
			}
			end := off + len(m[0])
			if end < len(line) && (isRefByte(line[end]) && line[end] != ':' || line[end] == '@') {
				continue // a longer name, or a digest that is not sha256:<64 hex>
			}
			add(i+1, line[start:end], m[1], digest.Digest(m[2]))
			off = end
		}
	}
	cands, err := deploy.Find(b, true)
	if err != nil {
		return out // not YAML: the text scan is all there is
	}
	out = append(out, scanWarmKeys(repo, name, b)...)
	for _, c := range cands {
		r, err := oci.ParseRef(c.Value)
		if err != nil || r.Repo() != want || strings.Contains(c.Value, want) {
			continue
		}
		add(c.Line, c.Value, r.Tag, r.Digest)
	}
	return out
}

// isRefByte reports whether c can be part of a repository name.
func isRefByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-/:", c) >= 0
}

// ScanPaths returns the references to repo in the files at paths. A
// directory is walked for *.yaml, *.yml and *.json files (skipping
// directories whose names start with a dot); a file named directly is read
// whatever its name. Sources are the path as given joined with the file's
// path inside the directory.
func ScanPaths(repo oci.Ref, paths []string) ([]Reference, error) {
	var out []Reference
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("refs: %w", err)
		}
		if !fi.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, fmt.Errorf("refs: %w", err)
			}
			out = append(out, Scan(repo, p, b)...)
			continue
		}
		err = filepath.WalkDir(p, func(f string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if f != p && strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				return nil
			}
			switch strings.ToLower(filepath.Ext(f)) {
			case ".yaml", ".yml", ".json":
			default:
				return nil
			}
			if !d.Type().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			out = append(out, Scan(repo, f, b)...)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("refs: %w", err)
		}
	}
	return out, nil
}
