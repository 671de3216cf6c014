package benchmarks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentiles(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want Pct
	}{
		{"empty", nil, Pct{}},
		{"one", []float64{7}, Pct{N: 1, P50: 7, P95: 7, P99: 7, Max: 7}},
		{"hundred", seq(1, 100), Pct{N: 100, P50: 50, P95: 95, P99: 99, Max: 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentiles(tt.xs); got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func seq(a, b int) []float64 {
	var out []float64
	for i := a; i <= b; i++ {
		out = append(out, float64(i))
	}
	return out
}

// TestReportWrite builds a report from synthetic runs and checks the
// summary, the goals and that every file is written.
func TestReportWrite(t *testing.T) {
	turns := func(class string, ck float64) []Turn {
		var ts []Turn
		for i := 0; i < 10; i++ {
			c, k := "none", 0.0
			if i%5 == 0 {
				c, k = class, ck
			}
			ts = append(ts, Turn{Index: i, Label: "ls", Class: c, CkptMS: k, StepMS: 10, Checked: true, Recovered: true})
		}
		return ts
	}
	full := turns("full", 200)
	for i := range full {
		full[i].Class, full[i].CkptMS = "full", 200
	}
	fsonly := turns("fs", 5)
	fsonly[3].Recovered, fsonly[3].Mismatch = false, []string{"shell", "procs"}
	rep := &Report{ThinkMS: 200, BranchN: []int{1, 8},
		Runs: []TraceRun{
			{Trace: "t", Mode: ModeArbor, Turns: turns("proc", 150), Recovery: turns("proc", 150)},
			{Trace: "t", Mode: ModeFull, Turns: full, Recovery: full},
			{Trace: "t", Mode: ModeFSOnly, Turns: fsonly, Recovery: fsonly},
		},
		Branch: map[string]map[int][]float64{ModeArbor: {1: {100}, 8: {400}, 32: {1600}}, "runc": {1: {700}, 8: {3000}, 32: {2400}},
			ModeArborPrepared: {1: {5}, 8: {30}, 32: {160}}},
		Tree: []TreeResult{{Factor: 4, BranchS: 2, ReplayS: 9}, {Factor: 5, BranchS: 4, ReplayS: 9}},
	}
	rep.Runs[0].ProcBytes, rep.Runs[1].ProcBytes = 10<<20, 50<<20
	rep.summarize()
	a := rep.mode(ModeArbor)
	if a.Classes["none"] != 8 || a.Classes["proc"] != 2 || a.Correct != 1 {
		t.Fatalf("arbor summary %+v", a)
	}
	if fo := rep.mode(ModeFSOnly); fo.Recovered != 9 || fo.MismatchBy["shell"] != 1 {
		t.Fatalf("files-only summary %+v", fo)
	}
	for _, g := range rep.Goals {
		if strings.Contains(g.Name, "p95") && g.Met {
			t.Errorf("p95 goal met with 150 ms vs 200 ms: %+v", g)
		}
		if strings.Contains(g.Name, "tree rollouts at branching factor 4") && !g.Met {
			t.Errorf("tree goal not met at 4.5x: %+v", g)
		}
	}
	// branch(32): cold 50 ms per child and 1.5x runc, not met; prepared
	// 5 ms per child and 15x runc, met.
	// CRIU bytes 5x below full, met; tree at b=5 2.25x, not met.
	want := map[string]bool{"branch(32) of a past state, per child amortized": false, "branch(32) p50, runc / Arbor": false,
		"CRIU image bytes written, full every turn / Arbor": true, "tree rollouts at branching factor 5, replay / branch": false,
		"branch(32) of a past state after prepare, per child amortized": true, "branch(32) p50, runc / Arbor after prepare": true}
	for _, g := range rep.Goals {
		if met, ok := want[g.Name]; ok {
			if g.Met != met {
				t.Errorf("goal %q met=%v, want %v: %+v", g.Name, g.Met, met, g)
			}
			delete(want, g.Name)
		}
	}
	for name := range want {
		t.Errorf("no goal %q", name)
	}
	dir := t.TempDir()
	if err := rep.Write(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"results.json", "results.md", "checkpoint-cdf.svg", "branch-scaling.svg", "turn-classes.svg", "tree-rollouts.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || len(b) == 0 {
			t.Errorf("%s: %v", f, err)
		}
		if strings.HasSuffix(f, ".svg") && (!strings.HasPrefix(string(b), "<svg") || strings.Contains(string(b), "NaN")) {
			t.Errorf("%s is not a clean SVG", f)
		}
	}
	// Rerender reads results.json back and writes the same report.
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "results.md")); err != nil {
		t.Fatal(err)
	}
	again, err := Rerender(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Goals) != len(rep.Goals) {
		t.Errorf("rerendered %d goals, want %d", len(again.Goals), len(rep.Goals))
	}
	if md2, err := os.ReadFile(filepath.Join(dir, "results.md")); err != nil || string(md2) != string(md) {
		t.Errorf("rerendered results.md differs (%v)", err)
	}
	if _, err := Rerender(t.TempDir()); err == nil {
		t.Error("Rerender of a folder without results.json: no error")
	}
}

// TestEmptyLogChart: a log-scale chart without data renders (it looped
// for ever, allocating, when arbor bench --branch-only had no checkpoint
// latencies to plot).
func TestEmptyLogChart(t *testing.T) {
	done := make(chan string, 1)
	go func() { done <- chart{title: "empty", logX: true}.render() }()
	select {
	case s := <-done:
		if !strings.Contains(s, "<svg") {
			t.Fatalf("render: %q", s)
		}
	case <-time.After(2 * time.Second):
		// Exit now: the loop allocates without bound.
		t.Error("rendering an empty log-scale chart does not end")
		os.Exit(1)
	}
}
