package trail

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTrailRoundTrip: segments and verdicts come back as written, output
// byte for byte (invalid UTF-8 included), after the file is reopened.
func TestTrailRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trail.db")
	s := open(t, path)
	seg := Segment{Parent: "s1", Turns: []Turn{
		{Turn: 2, Env: "e", State: "s1", Parent: "s1", Kind: "none", Action: Action{Tool: "bash", Cmd: "true"},
			Obs: Obs{Stdout: "", ExitCode: 0}, Started: time.Unix(10, 0).UTC(), StepS: 0.5},
		{Turn: 3, Env: "e", State: "s2", Parent: "s1", Kind: "fs", Action: Action{Tool: "write_file", Path: "a b", Content: []byte{0, 0xff, 'x'}},
			Obs: Obs{Stdout: "\xff\xfe bin", Stderr: "err\n", ExitCode: 3, Limits: []string{"memory limit 1: x"}}, Started: time.Unix(11, 0).UTC()},
	}}
	if err := s.PutSegment("s2", seg); err != nil {
		t.Fatal(err)
	}
	v := Verdict{Reward: 0.75, Details: map[string]any{"exit_code": int64(0)}, At: time.Unix(12, 0).UTC()}
	if err := s.PutVerdict("s2", v); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	defer s.Close()
	got, ok, err := s.Segment("s2")
	if err != nil || !ok {
		t.Fatalf("segment: %v %v", ok, err)
	}
	for i := range got.Turns {
		got.Turns[i].Started = got.Turns[i].Started.UTC()
	}
	if !reflect.DeepEqual(got, seg) {
		t.Fatalf("segment came back as\n%+v\nwant\n%+v", got, seg)
	}
	gv, ok, err := s.Verdict("s2")
	if err != nil || !ok || gv.Reward != 0.75 || gv.Details["exit_code"] != int8(0) && gv.Details["exit_code"] != int64(0) {
		t.Fatalf("verdict: %+v %v %v", gv, ok, err)
	}
	if _, ok, err := s.Segment("nope"); ok || err != nil {
		t.Fatalf("unknown state: %v %v", ok, err)
	}
}

// TestTrailSweep: the records of states keep calls gone are deleted, the
// others stay.
func TestTrailSweep(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "trail.db"))
	defer s.Close()
	for _, id := range []string{"a", "b", "c"} {
		if err := s.PutSegment(id, Segment{Turns: []Turn{{State: id}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutVerdict("b", Verdict{Reward: 1}); err != nil {
		t.Fatal(err)
	}
	asked := map[string]int{}
	n, err := s.Sweep(func(id string) bool { asked[id]++; return id == "a" })
	if err != nil || n != 3 {
		t.Fatalf("sweep deleted %d (%v), want 3 (b's segment and verdict, c's segment)", n, err)
	}
	if asked["b"] != 1 {
		t.Fatalf("keep asked %d times about b, want once", asked["b"])
	}
	for id, want := range map[string]bool{"a": true, "b": false, "c": false} {
		if _, ok, _ := s.Segment(id); ok != want {
			t.Fatalf("segment of %s kept: %v, want %v", id, ok, want)
		}
	}
	if _, ok, _ := s.Verdict("b"); ok {
		t.Fatal("verdict of b kept")
	}
}

// TestTrailLocked: a second opener of the same file fails with ErrLocked.
func TestTrailLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trail.db")
	s := open(t, path)
	defer s.Close()
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), ErrLocked.Error()) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
}

func TestTrailCut(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		max     int
		want    string
		wantCut bool
	}{
		{"short", "hello", 8, "hello", false},
		{"exact", "hello", 5, "hello", false},
		{"no cap", "hello", 0, "hello", false},
		{"cut", "abcdefghij", 4, "ab\n[... arbor: 6 bytes omitted ...]\nij", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, cut := Cut(tt.in, tt.max)
			if got != tt.want || cut != tt.wantCut {
				t.Fatalf("Cut(%q, %d) = %q, %v; want %q, %v", tt.in, tt.max, got, cut, tt.want, tt.wantCut)
			}
		})
	}
}
