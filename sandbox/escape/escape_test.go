package escape

import (
	"os"
	"strings"
	"testing"
)

// TestDocsListEveryRoute keeps docs/security.md's table in step with the
// suite.
func TestDocsListEveryRoute(t *testing.T) {
	b, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	names := map[string]bool{}
	for _, r := range Routes {
		if names[r.Name] {
			t.Errorf("route %s listed twice", r.Name)
		}
		names[r.Name] = true
		if !strings.Contains(doc, "| "+r.Name) && !strings.Contains(doc, ", "+r.Name) {
			t.Errorf("docs/security.md does not list route %s", r.Name)
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int
		wantErr bool
	}{
		{"two lines", `{"route":"a","verdict":"blocked","detail":"x"}` + "\n" + `{"route":"b","verdict":"open","detail":""}` + "\n", 2, false},
		{"blank lines", "\n\n" + `{"route":"a","verdict":"blocked"}` + "\n\n", 1, false},
		{"bad verdict", `{"route":"a","verdict":"maybe"}`, 0, true},
		{"not json", "open: yes", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, err := Parse([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want error %v", err, tt.wantErr)
			}
			if len(rs) != tt.want {
				t.Fatalf("%d results, want %d", len(rs), tt.want)
			}
		})
	}
}
