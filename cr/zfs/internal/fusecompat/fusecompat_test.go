package fusecompat

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseList(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		parsable bool
		pass     []string
		props    []string
		filters  []string
	}{
		{"GetDataset", []string{"-Hp", "-o", "name,used,written", "pool/a"}, true, nil, []string{"name", "used", "written"}, []string{"pool/a"}},
		{"Recursive", []string{"-rHp", "-t", "all", "-o", "name,origin"}, true, []string{"-r", "-t", "all"}, []string{"name", "origin"}, nil},
		{"Children", []string{"-d", "1", "-t", "all", "-Hp", "-o", "name", "pool"}, true, []string{"-d", "1", "-t", "all"}, []string{"name"}, []string{"pool"}},
		{"NotParsable", []string{"-H", "-o", "name"}, false, nil, []string{"name"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := parseList(tt.args)
			if !ok || r.parsable != tt.parsable || !slices.Equal(r.passArgs, tt.pass) ||
				!slices.Equal(r.props, tt.props) || !slices.Equal(r.filters, tt.filters) {
				t.Fatalf("parseList(%q) = %+v, %v", tt.args, r, ok)
			}
		})
	}
}

// TestListRetriesVanished: a dataset destroyed between the shim's name
// listing and its get fails the get; the shim lists again and answers
// what exists then, as zfs list would. The "real zfs" is a script whose
// first get fails that way.
func TestListRetriesVanished(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "zfs")
	script := `#!/bin/sh
state=` + dir + `/gone
case "$1" in
list) echo pool/a; [ -e "$state" ] || echo pool/b ;;
get)
	if [ ! -e "$state" ]; then
		touch "$state"
		echo "cannot open 'pool/b': dataset does not exist" >&2
		exit 1
	fi
	printf 'pool/a\tused\t42\n' ;;
esac
`
	if err := os.WriteFile(real, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := Main([]string{"list", "-rHp", "-o", "name,used"}, real, nil, &out, &errOut)
	if code != 0 || out.String() != "pool/a\t42\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want pool/a with its used", code, out.String(), errOut.String())
	}
}
