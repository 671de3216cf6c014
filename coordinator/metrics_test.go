package coordinator

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr/manifest"
)

// fakeUsage is an engine's accounting with a distinct value in every
// field the metrics export, and three watched file systems.
func fakeUsage() branch.Usage {
	var u branch.Usage
	u.Manifest.Artifacts = map[manifest.ArtifactKind]manifest.KindUsage{manifest.ArtifactFS: {Count: 3, Bytes: 5}, manifest.ArtifactProc: {Count: 7, Bytes: 11}}
	u.Manifest.States = 13
	u.GC = branch.GCStats{Passes: 17, Errors: 19, States: 23, Artifacts: 29, Bytes: 31, Envs: 43, LastPass: 37 * time.Millisecond, MaxPass: 41 * time.Millisecond}
	u.Disk = []branch.DiskUsage{{Name: branch.DiskPool, Used: 43, Free: 47, Total: 90}, {Name: branch.DiskCold, Used: 53, Free: 59, Total: 112, Over: true},
		{Name: branch.DiskHot, Used: 61, Free: 67, Total: 128}}
	u.Pressure = branch.PressureStats{Refused: 71, Evicted: 73, Shrunk: 79}
	u.Coord = branch.CoordStats{CheckpointTime: 83 * time.Second, Exposed: 89 * time.Second, Revived: 97, ShellDeltas: 109, DeltaImages: 113, DeltaSaved: 127}
	u.Images.HotBytes, u.Images.ColdBytes = 101, 103
	u.Warm = 107
	u.Prepare.Ready, u.Prepare.Queued = 131, 137
	u.Queue.Low.Queued, u.Queue.High.Queued, u.Queue.Running = 109, 113, 127
	return u
}

// TestEngineMetricsOneUsage: a scrape of the engine's metrics reads the
// engine's accounting once (Engine.Usage measures every disk and reads
// the manifest) and emits every series from it, with the names, help
// texts, types and labels of testdata/engine_metrics.txt (what the
// metrics were when each series read Usage for itself); a failed read
// exports zeros.
func TestEngineMetricsOneUsage(t *testing.T) {
	calls := 0
	var fail error
	reg := prometheus.NewRegistry()
	registerEngineMetrics(reg, func() (branch.Usage, error) {
		calls++
		if fail != nil {
			return branch.Usage{}, fail
		}
		return fakeUsage(), nil
	})
	scrape := func() string {
		t.Helper()
		calls = 0
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if calls != 1 {
			t.Errorf("a scrape read Usage %d times, want 1", calls)
		}
		var buf bytes.Buffer
		for _, mf := range mfs {
			if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
				t.Fatal(err)
			}
		}
		return buf.String()
	}
	want, err := os.ReadFile("testdata/engine_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := scrape(); got != string(want) {
		t.Errorf("scrape:\n%s\nwant:\n%s", got, want)
	}
	fail = errors.New("no manifest")
	got := scrape()
	if bytes.Count([]byte(got), []byte(" 0\n")) != bytes.Count(want, []byte("\n"))-bytes.Count(want, []byte("# ")) {
		t.Errorf("scrape after a failed Usage, want every series 0:\n%s", got)
	}
}
