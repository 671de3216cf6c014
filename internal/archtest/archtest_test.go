package archtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/arbor-env/arbor"

// row is one row of the layer table: the packages it covers, the packages
// of its own layer they may import, those below they never import.
type row struct {
	layer                 int
	packages, same, never []string
}

// matches tells whether pattern covers pkg, and how specifically: an exact
// path beats any tree, a longer tree a shorter one; 0 is no match.
func matches(pattern, pkg string) int {
	if pattern == pkg {
		return 1 << 20
	}
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok && (pkg == tree || strings.HasPrefix(pkg, tree+"/")) {
		return len(tree) + 1
	}
	return 0
}

func matchesAny(patterns []string, pkg string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return matches(p, pkg) > 0 })
}

// rowOf is the row of pkg's most specific pattern, -1 if none covers it.
func rowOf(table []row, pkg string) int {
	best, score := -1, 0
	for i, r := range table {
		for _, p := range r.packages {
			if s := matches(p, pkg); s > score {
				best, score = i, s
			}
		}
	}
	return best
}

// check returns every way graph (each package of the module and its
// imports of the module, paths relative to it) breaks table, sorted.
func check(table []row, graph map[string][]string) []string {
	var bad []string
	used := map[string]bool{} // "row pattern" that covers a package
	for pkg, imports := range graph {
		i := rowOf(table, pkg)
		if i < 0 {
			bad = append(bad, fmt.Sprintf("%s is in no layer", pkg))
			continue
		}
		r := table[i]
		for _, p := range r.packages {
			if matches(p, pkg) > 0 {
				used[fmt.Sprint(i, p)] = true
			}
		}
		for _, imp := range imports {
			j := rowOf(table, imp)
			switch {
			case j < 0: // reported as a package of its own
			case matchesAny(r.never, imp):
				bad = append(bad, fmt.Sprintf("%s (layer %d) imports %s, which its row never imports", pkg, r.layer, imp))
			case table[j].layer > r.layer:
				bad = append(bad, fmt.Sprintf("%s (layer %d) imports %s of layer %d, above it", pkg, r.layer, imp, table[j].layer))
			case table[j].layer == r.layer && !matchesAny(r.same, imp):
				bad = append(bad, fmt.Sprintf("%s (layer %d) imports %s of its own layer, which its row does not allow", pkg, r.layer, imp))
			}
		}
	}
	for i, r := range table {
		for _, p := range r.packages {
			if !used[fmt.Sprint(i, p)] {
				bad = append(bad, fmt.Sprintf("%s (layer %d) covers no package", p, r.layer))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

var quoted = regexp.MustCompile("`([^`]+)`")

// parseTable reads the layer table of docs/architecture.md: the rows after
// the header "| layer | packages | ...", each "| N | `pattern`, ... |
// `same`, ... | `never`, ... | what |".
func parseTable(doc string) ([]row, error) {
	var table []row
	in := false
	for line := range strings.SplitSeq(doc, "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		switch {
		case !in:
			in = len(cells) >= 4 && strings.TrimSpace(cells[0]) == "layer" && strings.TrimSpace(cells[1]) == "packages"
			continue
		case !strings.HasPrefix(line, "|"):
			return table, nil
		case strings.HasPrefix(line, "|---"):
			continue
		case len(cells) < 4:
			return nil, fmt.Errorf("row %q: want layer, packages, same layer, never", line)
		}
		layer, err := strconv.Atoi(strings.TrimSpace(cells[0]))
		if err != nil {
			return nil, fmt.Errorf("row %q: layer: %w", line, err)
		}
		r := row{layer: layer, packages: patterns(cells[1]), same: patterns(cells[2]), never: patterns(cells[3])}
		if len(r.packages) == 0 {
			return nil, fmt.Errorf("row %q: no packages", line)
		}
		table = append(table, r)
	}
	if !in {
		return nil, fmt.Errorf("no table with the header | layer | packages | ...")
	}
	return table, nil
}

func patterns(cell string) []string {
	var ps []string
	for _, m := range quoted.FindAllStringSubmatch(cell, -1) {
		ps = append(ps, m[1])
	}
	return ps
}

// TestLayers checks every import of the module against the layers of
// docs/architecture.md.
func TestLayers(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list the module's imports: %v", err)
	}
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	table, err := parseTable(string(doc))
	if err != nil {
		t.Fatalf("docs/architecture.md: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	graph := map[string][]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, ok := strings.CutPrefix(fields[0], module+"/")
		if !ok {
			t.Fatalf("go list: %s is not in module %s", fields[0], module)
		}
		graph[pkg] = nil
		for _, imp := range fields[1:] {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
				graph[pkg] = append(graph[pkg], rel)
			}
		}
	}
	if len(graph) < 40 {
		t.Fatalf("go list listed %d packages:\n%s", len(graph), out)
	}
	for _, b := range check(table, graph) {
		t.Errorf("docs/architecture.md: %s", b)
	}
}

// TestCheck plants each kind of violation in a small module.
func TestCheck(t *testing.T) {
	table, err := parseTable(`
| layer | packages | may import of its own layer | never imports | what |
|---|---|---|---|---|
| 0 | ` + "`a`" + ` | | | |
| 1 | ` + "`b/...`" + ` | ` + "`b/...`" + ` | | |
| 1 | ` + "`c`, `gone`" + ` | | | |
| 2 | ` + "`b/top`" + ` | | ` + "`a`" + ` | |

after the table`)
	if err != nil {
		t.Fatal(err)
	}
	got := check(table, map[string][]string{
		"a":     {"c"},        // up
		"b":     {"a", "b/x"}, // allowed
		"b/x":   {"c"},        // same layer, not allowed
		"c":     {"a"},
		"b/top": {"a", "b"}, // never; b is below b/top although b/... covers it
		"d":     nil,        // in no layer
	})
	want := []string{
		"a (layer 0) imports c of layer 1, above it",
		"b/top (layer 2) imports a, which its row never imports",
		"b/x (layer 1) imports c of its own layer, which its row does not allow",
		"d is in no layer",
		"gone (layer 1) covers no package",
	}
	if !slices.Equal(got, want) {
		t.Errorf("check:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
