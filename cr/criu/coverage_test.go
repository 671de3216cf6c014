package criu_test

import (
	"bufio"
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/internal/criubin"
)

// The coverage tables of docs/inspector.md ("Kernel state coverage") are
// checked against CRIU's list of image types (testdata) and the installed
// CRIU here, and against this kernel's /proc in coverage_linux_test.go.

const (
	inspectorDoc   = "../../docs/inspector.md"
	imageTypesFile = "testdata/criu-image-types.txt"
)

// imageTypes reads the committed list: image name -> entry name.
func imageTypes(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(imageTypesFile)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("%s: malformed line %q", imageTypesFile, line)
		}
		if _, dup := types[f[0]]; dup {
			t.Fatalf("%s: %s listed twice", imageTypesFile, f[0])
		}
		types[f[0]] = f[1]
	}
	if len(types) < 80 {
		t.Fatalf("%s lists %d image types; CRIU 4.2 has 85", imageTypesFile, len(types))
	}
	return types
}

var rowKey = regexp.MustCompile("^\\| `([^`]+)` \\|")

// coverageRows returns the keys (first column) of the rows of the table
// under the heading "### "+table in docs/inspector.md's section "Kernel
// state coverage", failing on a key given twice or a row of the wrong
// number of columns.
func coverageRows(t *testing.T, table string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(inspectorDoc)
	if err != nil {
		t.Fatal(err)
	}
	var section, in bool
	rows := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == "## Kernel state coverage"
			in = false
			continue
		case strings.HasPrefix(line, "### "):
			in = section && line == "### "+table
			continue
		}
		if !in {
			continue
		}
		m := rowKey.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		// Five cells: key, what or where, detected, restored, production.
		if n := strings.Count(line, " | ") + 2; n != 6 {
			t.Errorf("%s, table %q: row %s has %d cells, want 5 (a \"|\" inside a cell?)", inspectorDoc, table, m[1], n-1)
		}
		if rows[m[1]] {
			t.Errorf("%s, table %q: row %s given twice", inspectorDoc, table, m[1])
		}
		rows[m[1]] = true
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no table %q under \"## Kernel state coverage\"", inspectorDoc, table)
	}
	return rows
}

// sameKeys reports what want has that got lacks and the reverse.
func sameKeys(t *testing.T, what string, want, got map[string]bool) {
	t.Helper()
	var missing, extra []string
	for k := range want {
		if !got[k] {
			missing = append(missing, k)
		}
	}
	for k := range got {
		if !want[k] {
			extra = append(extra, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 {
		t.Errorf("%s: no row for %s", what, strings.Join(missing, ", "))
	}
	if len(extra) > 0 {
		t.Errorf("%s: rows for what nothing requires: %s", what, strings.Join(extra, ", "))
	}
}

// TestInspectorTableCoversCRIUImages: docs/inspector.md's table of image
// types has exactly one row for each image type CRIU lists.
func TestInspectorTableCoversCRIUImages(t *testing.T) {
	want := map[string]bool{}
	for name := range imageTypes(t) {
		want[name] = true
	}
	sameKeys(t, inspectorDoc+", \"CRIU image types\" (against "+imageTypesFile+")", want, coverageRows(t, "CRIU image types"))
}

// imgName matches the image file names compiled into CRIU (image-desc.c's
// templates, each ending in ".img").
var imgName = regexp.MustCompile(`^[a-z0-9][a-z0-9%-]*(\.tar\.gz)?\.img$`)

// criuImageNames returns the image names (without ".img") that the CRIU
// binary at path holds as strings. A name the linker merged into the tail
// of a longer one ("files.img" in "reg-files.img") is not seen; every name
// seen is one CRIU writes or reads.
func criuImageNames(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range bytes.Split(b, []byte{0}) {
		if imgName.Match(s) {
			names = append(names, strings.TrimSuffix(string(s), ".img"))
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// installedCRIU returns the CRIU executable criubin resolves, looking
// through scripts/deps.sh's wrapper script to the binary it runs.
func installedCRIU(t *testing.T) string {
	t.Helper()
	p, err := criubin.Path("")
	if err != nil {
		t.Skipf("criu 4.x not installed: run make deps (%v)", err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("#!")) {
		return p
	}
	m := regexp.MustCompile(`(/\S+/sbin/criu)\b`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s is a script that names no .../sbin/criu", p)
	}
	return string(m[1])
}

// TestInstalledCRIUImageTypes: every image type the installed CRIU knows
// is in the committed list (and so, by TestInspectorTableCoversCRIUImages,
// has a row): a CRIU upgrade that adds one fails here.
func TestInstalledCRIUImageTypes(t *testing.T) {
	types := imageTypes(t)
	bin := installedCRIU(t)
	names := criuImageNames(t, bin)
	// The scan must find the list it checks: most of the types, and those
	// every dump of Arbor's writes.
	if len(names) < len(types)/2 {
		t.Fatalf("found %d image names in %s, want most of the %d listed: %q", len(names), bin, len(types), names)
	}
	for _, n := range []string{"inventory", "core-%u", "pstree", "pages-%u", "fdinfo-%u"} {
		if !slices.Contains(names, n) {
			t.Fatalf("%s holds no %s.img: the scan is broken (found %q)", bin, n, names)
		}
	}
	for _, n := range names {
		if _, ok := types[n]; !ok {
			t.Errorf("the installed CRIU (%s) has image type %s.img, which %s lacks: add it there and a row to %s", bin, n, imageTypesFile, inspectorDoc)
		}
	}
}
