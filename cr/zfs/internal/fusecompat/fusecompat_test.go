package fusecompat

import (
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
