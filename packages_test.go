package bdnvol_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/bdnvol/bdnvol/"

// packageRule is one row of docs/packages.md.
type packageRule struct {
	may    []string // allowed bdnvol imports; a trailing "…" allows a prefix
	coming bool     // the package is being added and may be absent
}

func (r packageRule) allows(imp string) bool {
	for _, m := range r.may {
		if p, ok := strings.CutSuffix(m, "…"); ok && strings.HasPrefix(imp, p) || imp == m {
			return true
		}
	}
	return false
}

// readPackageMap parses the table of docs/packages.md.
func readPackageMap(t *testing.T) map[string]packageRule {
	t.Helper()
	b, err := os.ReadFile("docs/packages.md")
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]packageRule{}
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		r := packageRule{coming: strings.Contains(cells[2], "being added")}
		for _, f := range strings.Split(cells[3], "`") {
			if f = strings.TrimSpace(f); f != "" && (strings.HasPrefix(f, "pkg/") || strings.HasPrefix(f, "internal/")) {
				r.may = append(r.may, f)
			}
		}
		rules[name] = r
	}
	if len(rules) == 0 {
		t.Fatal("docs/packages.md has no package rows")
	}
	return rules
}

// TestPackageMap keeps docs/packages.md true: every package has a row, and
// imports only what its row allows (never internal/testutil, which is for
// tests).
func TestPackageMap(t *testing.T) {
	rules := readPackageMap(t)
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, ok := strings.CutPrefix(fields[0], module)
		if !ok {
			continue // the module root
		}
		seen[pkg] = true
		r, ok := rules[pkg]
		if !ok {
			t.Errorf("%s has no row in docs/packages.md", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if imp == module+"internal/testutil" {
				t.Errorf("%s imports internal/testutil, which only tests may import", pkg)
				continue
			}
			if imp, ok := strings.CutPrefix(imp, module); ok && !r.allows(imp) {
				t.Errorf("%s imports %s, which docs/packages.md does not allow", pkg, imp)
			}
		}
	}
	for pkg, r := range rules {
		if !seen[pkg] && !r.coming {
			t.Errorf("docs/packages.md has a row for %s, which is not in the tree", pkg)
		}
	}
}

// readTiers parses the "Tiers:" line of docs/packages.md: the packages of
// each tier, top down; a trailing "…" names a prefix.
func readTiers(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile("docs/packages.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Tiers:")
		if !ok {
			continue
		}
		var tiers [][]string
		for _, tier := range strings.Split(rest, "→") {
			var names []string
			for _, n := range strings.Split(strings.Trim(strings.TrimSpace(tier), "{}"), ",") {
				names = append(names, strings.Trim(strings.TrimSpace(n), "`"))
			}
			tiers = append(tiers, names)
		}
		return tiers
	}
	t.Fatal("docs/packages.md has no Tiers: line")
	return nil
}

// tierOf returns the tier of pkg, or -1.
func tierOf(tiers [][]string, pkg string) int {
	for i, names := range tiers {
		for _, n := range names {
			if p, ok := strings.CutSuffix(n, "…"); ok && strings.HasPrefix(pkg, p) || pkg == n {
				return i
			}
		}
	}
	return -1
}

// TestPackageTiers keeps the tier line of docs/packages.md true: every
// package has a tier, and no import goes to a higher one.
func TestPackageTiers(t *testing.T) {
	tiers := readTiers(t)
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, ok := strings.CutPrefix(fields[0], module)
		if !ok {
			continue // the module root
		}
		tier := tierOf(tiers, pkg)
		if tier < 0 {
			t.Errorf("%s has no tier in docs/packages.md", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if imp, ok := strings.CutPrefix(imp, module); ok && tierOf(tiers, imp) >= 0 && tierOf(tiers, imp) < tier {
				t.Errorf("%s imports %s, a tier above it in docs/packages.md", pkg, imp)
			}
		}
	}
}

// mayImportSentence is the one thing a package's doc comment may say about
// its imports: the package map says the rest, and is checked.
const mayImportSentence = "What it may import is its row of docs/packages.md."

// TestPackageDocsDeferImports keeps package doc comments from drifting from
// docs/packages.md: a doc comment that speaks of what its package may
// import, or of who imports it, says only mayImportSentence (a list of
// packages there went stale twice).
func TestPackageDocsDeferImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{.Dir}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	fset := token.NewFileSet()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, dir, _ := strings.Cut(line, " ")
		pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkgs {
			for name, f := range p.Files {
				if f.Doc == nil {
					continue
				}
				doc := strings.Join(strings.Fields(f.Doc.Text()), " ")
				rest := strings.ReplaceAll(doc, mayImportSentence, "")
				for _, phrase := range []string{"may import", "imports it", "imported by"} {
					if strings.Contains(rest, phrase) {
						t.Errorf("%s (%s): the package doc says what %q; say only %q", pkg, filepath.Base(name), phrase, mayImportSentence)
					}
				}
			}
		}
	}
}
