package benchmarks

import "testing"

func TestLoadTraces(t *testing.T) {
	traces, err := LoadTraces("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(traces) < 3 {
		t.Fatalf("want at least 3 traces, got %d", len(traces))
	}
	classes := map[string]int{}
	for _, tr := range traces {
		for _, a := range tr.All() {
			if a.ContentFile != "" && a.Content == "" {
				t.Errorf("%s: content_file %s not resolved", tr.Name, a.ContentFile)
			}
		}
		for _, a := range tr.Turns {
			classes[a.Expect]++
		}
	}
	for _, k := range []string{"none", "fs", "proc", "full"} {
		if classes[k] == 0 {
			t.Errorf("no turn expected to be %s", k)
		}
	}
}

func TestParseTraceRejects(t *testing.T) {
	tests := []struct {
		name, yaml string
	}{
		{"no turns", "name: x\n"},
		{"two tools", "name: x\nturns:\n  - bash: ls\n    read_file: /a\n"},
		{"bad expect", "name: x\nturns:\n  - bash: ls\n    expect: some\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ParseTrace([]byte(tt.yaml), nil); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
