package manifest

import (
	"errors"
	"testing"
	"time"

	"github.com/arbor-env/arbor/state"
)

// An imported state (its parent elsewhere, its env another node's) is
// kept for its retention and then collected with its artifacts; reopened
// as a migrated env's head, its lineage is live again.
func TestImportState(t *testing.T) {
	m := openTest(t, Options{})
	for _, a := range []Artifact{{ID: "f1", Kind: ArtifactFS, Location: "states/f1"}, {ID: "p1", Kind: ArtifactProc, Location: "p1"}} {
		if err := m.BeginArtifact(a); err != nil {
			t.Fatal(err)
		}
	}
	st := State{ID: "s2", Env: "e1", Parent: "s1", Turn: 2, Kind: state.Full, FS: "f1", Proc: "p1", Released: false, Pinned: true}
	env := Env{ID: "e1", Image: "busybox", Origin: "e0", Labels: map[string]string{"task": "t0"}}
	if err := m.ImportState(env, st, t0, "f1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("import with a proc artifact not ready: %v", err)
	}
	if err := m.ImportState(env, st, t0, "f1", "p1"); err != nil {
		t.Fatal(err)
	}
	if err := m.ImportState(env, st, t0, "f1", "p1"); !errors.Is(err, ErrExists) {
		t.Fatalf("second import: %v", err)
	}
	got, err := m.GetState("s2")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Released || !got.ClosedAt.Equal(t0) || got.Pinned || got.Parent != "s1" {
		t.Errorf("imported state %+v", got)
	}
	e, err := m.GetEnv("e1")
	if err != nil || !e.Closed || !e.Imported || e.Image != "busybox" || e.Origin != "e0" || e.Labels["task"] != "t0" {
		t.Errorf("env record %+v, %v", e, err)
	}
	if err := m.Check(); err != nil {
		t.Errorf("check: %v", err)
	}
	g, err := m.Collect(Policy{Now: t0.Add(time.Minute), Retain: time.Hour})
	if err != nil || len(g.States) != 0 {
		t.Errorf("within the retention: garbage %v, %v", g.States, err)
	}
	g, err = m.Collect(Policy{Now: t0.Add(2 * time.Hour), Retain: time.Hour})
	if err != nil || len(g.States) != 1 {
		t.Errorf("after the retention: garbage %v, %v", g.States, err)
	}
	if err := m.ReopenEnv("e1", "s2", map[string]string{"task": "t"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.GetState("s2"); got.Released || !got.ClosedAt.IsZero() {
		t.Errorf("reopened env's state still released: %+v", got)
	}
	if e, _ := m.GetEnv("e1"); e.Closed || e.Head != "s2" || e.Labels["task"] != "t" {
		t.Errorf("reopened env %+v", e)
	}
	g, err = m.Collect(Policy{Now: t0.Add(2 * time.Hour), Retain: time.Hour})
	if err != nil || len(g.States) != 0 {
		t.Errorf("open env's head collected: %v, %v", g.States, err)
	}
}
