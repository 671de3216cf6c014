package watch

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/state"
)

// TestCompareCap: Options.MaxCompareBytes bounds what one turn's file
// comparisons read; two identical 1 MiB files fit the default cap and are
// unchanged, and past a smaller cap the second one counts as changed,
// with the reason, not as unaccounted.
func TestCompareCap(t *testing.T) {
	dir := t.TempDir()
	live, snap := filepath.Join(dir, "live"), filepath.Join(dir, "snap")
	data := bytes.Repeat([]byte("c"), 1<<20)
	mtime := []unix.Timespec{{Sec: 1_700_000_000}, {Sec: 1_700_000_000}}
	for _, root := range []string{live, snap} {
		for _, name := range []string{"a", "b"} {
			p := filepath.Join(root, "work", name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := unix.UtimesNano(p, mtime); err != nil {
				t.Fatal(err)
			}
		}
	}
	target := inspector.Target{
		LiveRoot:     live,
		SnapshotRoot: snap,
		Changes: func(context.Context) ([]cr.Change, error) {
			return []cr.Change{{Path: "/work/a"}, {Path: "/work/b"}}, nil
		},
	}
	tests := []struct {
		name     string
		max      int64
		wantSame []string
		wantFact string // "" for no fact
	}{
		{name: "default cap", max: 0, wantSame: []string{"/work/a", "/work/b"}},
		{name: "cap of one pair", max: 3 << 20, wantSame: []string{"/work/a"}, wantFact: "file /work/b changed: content not compared, past the turn's 3145728-byte read cap"},
		{name: "no reads", max: -1, wantFact: "file /work/a changed: content not compared, past the turn's 0-byte read cap"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := NewFallback(Options{Logger: slog.New(slog.DiscardHandler), MaxCompareBytes: tt.max})
			var same []string
			facts := in.fileFacts(context.Background(), target, nil, nil, &same)
			if strings.Join(same, " ") != strings.Join(tt.wantSame, " ") {
				t.Errorf("unchanged %q, want %q", same, tt.wantSame)
			}
			r := inspector.Classify(facts)
			if tt.wantFact == "" {
				if r.Kind != state.None {
					t.Errorf("kind %s (%q), want none", r.Kind, r.Reasons)
				}
				return
			}
			if r.Kind != state.FS || len(r.Reasons) == 0 || r.Reasons[0] != tt.wantFact {
				t.Errorf("kind %s, reasons %q; want fs, first %q", r.Kind, r.Reasons, tt.wantFact)
			}
		})
	}
}
