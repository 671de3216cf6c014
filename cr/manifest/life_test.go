package manifest

import (
	"reflect"
	"testing"
	"time"

	"github.com/arbor-env/arbor/state"
)

// TestReleaseClosed: ReleaseClosedAt releases what an env closed without
// a release (CloseEnv) kept, with its retention from then, and leaves
// open envs, lost envs and states released before alone.
func TestReleaseClosed(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := openTest(t, Options{})
	for _, e := range []string{"open", "closed", "lost", "released"} {
		putEnv(t, m, e)
	}
	checkpoint(t, m, "open", "o", "", 0, state.Full)
	checkpoint(t, m, "closed", "c1", "", 0, state.Full)
	checkpoint(t, m, "closed", "c2", "c1", 1, state.FS)
	checkpoint(t, m, "lost", "l", "", 0, state.Full)
	checkpoint(t, m, "released", "r", "", 0, state.Full)
	if err := m.ReleaseEnvAt("released", t0.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := m.CloseEnv("closed"); err != nil {
		t.Fatal(err)
	}
	if err := m.MarkLost("lost", "no restore"); err != nil {
		t.Fatal(err)
	}
	n, err := m.ReleaseClosedAt(t0)
	if err != nil || n != 2 {
		t.Fatalf("ReleaseClosedAt = %d, %v; want the 2 states of the closed env", n, err)
	}
	for id, want := range map[string]State{
		"o": {}, "l": {}, "c1": {Released: true, ClosedAt: t0}, "c2": {Released: true, ClosedAt: t0},
		"r": {Released: true, ClosedAt: t0.Add(-time.Hour)},
	} {
		s, err := m.GetState(id)
		if err != nil || s.Released != want.Released || !s.ClosedAt.Equal(want.ClosedAt) {
			t.Errorf("state %s: released %v closed at %v (%v); want %v at %v", id, s.Released, s.ClosedAt, err, want.Released, want.ClosedAt)
		}
	}
	if n, err := m.ReleaseClosedAt(t0.Add(time.Hour)); err != nil || n != 0 {
		t.Errorf("second ReleaseClosedAt = %d, %v; want nothing left to release", n, err)
	}
}

// TestForgetEnvs: the records of closed envs without states go, a branch
// child before its origin and within the bound; an env named as origin
// by one that stays, a lost env, an open one and one with states stay.
func TestForgetEnvs(t *testing.T) {
	m := openTest(t, Options{})
	for _, e := range []Env{
		{ID: "open"}, {ID: "empty", Closed: true}, {ID: "child", Closed: true, Origin: "empty"},
		{ID: "grandchild", Closed: true, Origin: "child"}, {ID: "lost"}, {ID: "kept"},
		{ID: "origin", Closed: true}, {ID: "live", Origin: "origin"},
	} {
		if err := m.PutEnv(e); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint(t, m, "open", "o", "", 0, state.Full)
	checkpoint(t, m, "kept", "k", "", 0, state.Full)
	if err := m.CloseEnv("kept"); err != nil {
		t.Fatal(err)
	}
	if err := m.MarkLost("lost", "no committed state"); err != nil {
		t.Fatal(err)
	}
	got, more, err := m.ForgetEnvs(2)
	if err != nil || !more || !reflect.DeepEqual(got, []string{"grandchild", "child"}) {
		t.Fatalf("ForgetEnvs(2) = %v, more %v, %v; want grandchild and child, more", got, more, err)
	}
	got, more, err = m.ForgetEnvs(2)
	if err != nil || more || !reflect.DeepEqual(got, []string{"empty"}) {
		t.Fatalf("second ForgetEnvs(2) = %v, more %v, %v; want empty, no more", got, more, err)
	}
	es, err := m.Envs()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range es {
		left = append(left, e.ID)
	}
	if want := []string{"kept", "live", "lost", "open", "origin"}; !reflect.DeepEqual(left, want) {
		t.Errorf("envs left %v, want %v", left, want)
	}
	if err := m.Check(); err != nil {
		t.Error(err)
	}
}

// TestCollectMaxBytes: under a byte bound Collect lists states, in its
// order, until the artifacts only they use reach the bound of every kind
// given; shared artifacts count once and a live state's not at all.
func TestCollectMaxBytes(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "open")
	putEnv(t, m, "old")
	checkpoint(t, m, "open", "o", "", 0, state.Full)
	checkpoint(t, m, "old", "a", "o", 1, state.FS)   // fs 100, proc o's (live)
	checkpoint(t, m, "old", "b", "a", 2, state.Proc) // fs a's (counted with a), proc 1000
	checkpoint(t, m, "old", "c", "b", 3, state.FS)   // fs 100
	checkpoint(t, m, "old", "d", "c", 4, state.FS)   // fs 100
	if err := m.ReleaseEnvAt("old", t0); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		max  map[ArtifactKind]int64
		want []string
		more bool
	}{
		{nil, []string{"a", "b", "c", "d"}, false},
		{map[ArtifactKind]int64{ArtifactFS: 150}, []string{"a", "b", "c"}, true},
		{map[ArtifactKind]int64{ArtifactFS: 100}, []string{"a"}, true},
		{map[ArtifactKind]int64{ArtifactProc: 1}, []string{"a", "b"}, true},
		{map[ArtifactKind]int64{ArtifactFS: 250, ArtifactProc: 1}, []string{"a", "b", "c", "d"}, false},
		{map[ArtifactKind]int64{ArtifactFS: 1 << 40}, []string{"a", "b", "c", "d"}, false},
		{map[ArtifactKind]int64{"": 1001}, []string{"a", "b"}, true},
	} {
		g, err := m.Collect(Policy{Now: t0, Retain: time.Hour, Evict: true, MaxBytes: tt.max})
		if err != nil || !reflect.DeepEqual(ids(g.States), tt.want) || g.More != tt.more {
			t.Errorf("MaxBytes %v: %v more %v, %v; want %v more %v", tt.max, ids(g.States), g.More, err, tt.want, tt.more)
		}
	}
}
