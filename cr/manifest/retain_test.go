package manifest

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/arbor-env/arbor/state"
)

// TestRetention: the tree of TestGarbageAndForget, with e2 (x, y, a
// branch of a) closed at t0 and the policy's clock and retention varied.
func TestRetention(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	setup := func(t *testing.T, m *Manifest) {
		putEnv(t, m, "e1")
		putEnv(t, m, "e2")
		checkpoint(t, m, "e1", "r", "", 0, state.Full)
		checkpoint(t, m, "e1", "a", "r", 1, state.FS)
		checkpoint(t, m, "e1", "b", "a", 2, state.Proc)
		checkpoint(t, m, "e1", "c", "b", 3, state.FS)
		checkpoint(t, m, "e2", "x", "a", 2, state.Full)
		checkpoint(t, m, "e2", "y", "x", 3, state.FS)
	}
	do := func(f func(m *Manifest) error) func(*testing.T, *Manifest) {
		return func(t *testing.T, m *Manifest) {
			if err := f(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	closeE2 := func(m *Manifest) error { return m.ReleaseEnvAt("e2", t0) }
	tests := []struct {
		name       string
		act        []func(*testing.T, *Manifest)
		p          Policy
		wantStates []string
		wantNext   time.Time
	}{
		{name: "within retention", act: []func(*testing.T, *Manifest){do(closeE2)},
			p: Policy{Now: t0.Add(time.Minute), Retain: 10 * time.Minute}, wantStates: []string{}, wantNext: t0.Add(10 * time.Minute)},
		{name: "retention over", act: []func(*testing.T, *Manifest){do(closeE2)},
			p: Policy{Now: t0.Add(10 * time.Minute), Retain: 10 * time.Minute}, wantStates: []string{"x", "y"}},
		{name: "no retention", act: []func(*testing.T, *Manifest){do(closeE2)},
			p: Policy{Now: t0, Retain: 0}, wantStates: []string{"x", "y"}},
		{name: "released by name within retention", act: []func(*testing.T, *Manifest){do(closeE2), do(func(m *Manifest) error { return m.Release("y") })},
			p: Policy{Now: t0.Add(time.Minute), Retain: 10 * time.Minute}, wantStates: []string{"y"}, wantNext: t0.Add(10 * time.Minute)},
		{name: "pinned outlives retention", act: []func(*testing.T, *Manifest){do(func(m *Manifest) error { return m.Pin("x") }), do(closeE2)},
			p: Policy{Now: t0.Add(time.Hour), Retain: time.Minute}, wantStates: []string{"y"}},
		{name: "pinned and released by name stays", act: []func(*testing.T, *Manifest){do(closeE2), do(func(m *Manifest) error { return m.Pin("y") }),
			do(func(m *Manifest) error { return m.Release("x", "y") })},
			p: Policy{Now: t0, Retain: 0}, wantStates: []string{}},
		{name: "unpinned goes", act: []func(*testing.T, *Manifest){do(func(m *Manifest) error { return m.Pin("y") }), do(closeE2),
			do(func(m *Manifest) error { return m.Unpin("y") })},
			p: Policy{Now: t0.Add(time.Hour), Retain: time.Minute}, wantStates: []string{"x", "y"}},
		{name: "kept by the caller", act: []func(*testing.T, *Manifest){do(closeE2)},
			p: Policy{Now: t0, Keep: []string{"x", "nosuch"}}, wantStates: []string{"y"}},
		{name: "head of an open env released by name stays", act: []func(*testing.T, *Manifest){do(func(m *Manifest) error { return m.Release("c", "b") })},
			p: Policy{Now: t0}, wantStates: []string{}},
		{name: "closed after a release by name: the released state has no retention",
			act: []func(*testing.T, *Manifest){do(func(m *Manifest) error { return m.Release("y") }), do(closeE2)},
			p:   Policy{Now: t0.Add(time.Minute), Retain: 10 * time.Minute}, wantStates: []string{"y"}, wantNext: t0.Add(10 * time.Minute)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := openTest(t, Options{})
			setup(t, m)
			for _, a := range tt.act {
				a(t, m)
			}
			g, err := m.Collect(tt.p)
			if err != nil {
				t.Fatal(err)
			}
			got := ids(g.States)
			if len(got) > 1 && got[0] > got[1] { // oldest first: same instant here
				got[0], got[1] = got[1], got[0]
			}
			if !reflect.DeepEqual(got, tt.wantStates) || !g.Next.Equal(tt.wantNext) || g.More {
				t.Fatalf("collect: states %v next %v more %v, want %v next %v", got, g.Next, g.More, tt.wantStates, tt.wantNext)
			}
			if err := m.ForgetWith(tt.p, ids(g.States), artifactIDs(g.Artifacts)); err != nil {
				t.Fatal(err)
			}
			if g, err := m.Collect(tt.p); err != nil || len(g.States)+len(g.Artifacts) != 0 {
				t.Errorf("garbage after forget: %v %v %v", ids(g.States), artifactIDs(g.Artifacts), err)
			}
		})
	}
}

// TestForgetWithRefusesRetained: what a policy keeps cannot be forgotten
// under it, though a policy without retention may.
func TestForgetWithRefusesRetained(t *testing.T) {
	t0 := time.Now()
	m := openTest(t, Options{})
	putEnv(t, m, "e1")
	checkpoint(t, m, "e1", "r", "", 0, state.Full)
	checkpoint(t, m, "e1", "a", "r", 1, state.FS)
	if err := m.ReleaseEnvAt("e1", t0); err != nil {
		t.Fatal(err)
	}
	keep := Policy{Now: t0, Retain: time.Hour}
	if err := m.ForgetWith(keep, []string{"a"}, nil); !errors.Is(err, ErrInUse) {
		t.Fatalf("forget a retained state: %v, want ErrInUse", err)
	}
	if err := m.ForgetWith(Policy{Now: t0, Retain: time.Hour, Keep: []string{"a"}}, nil, []string{"fs-a"}); !errors.Is(err, ErrInUse) {
		t.Fatalf("forget an artifact of a kept state: %v, want ErrInUse", err)
	}
	if err := m.ForgetWith(Policy{Now: t0.Add(time.Hour), Retain: time.Hour}, []string{"a"}, []string{"fs-a"}); err != nil {
		t.Fatalf("forget after the retention: %v", err)
	}
}

// TestCollectBounds: one Collect returns at most MaxStates states and
// MaxArtifacts artifacts and says there is more; repeated collections get
// everything.
func TestCollectBounds(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "e1")
	parent := ""
	for i, id := range []string{"s0", "s1", "s2", "s3", "s4"} {
		checkpoint(t, m, "e1", id, parent, i, state.Full)
		parent = id
	}
	if err := m.ReleaseEnvAt("e1", time.Now()); err != nil {
		t.Fatal(err)
	}
	p := Policy{MaxStates: 2, MaxArtifacts: 3}
	var all []string
	for pass := 0; ; pass++ {
		g, err := m.Collect(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.States) > 2 || len(g.Artifacts) > 3 {
			t.Fatalf("pass %d: %d states, %d artifacts: over the bounds", pass, len(g.States), len(g.Artifacts))
		}
		if len(g.States)+len(g.Artifacts) == 0 {
			if g.More {
				t.Fatal("nothing collected but more announced")
			}
			break
		}
		if pass > 10 {
			t.Fatal("collection does not end")
		}
		if err := m.ForgetWith(p, ids(g.States), artifactIDs(g.Artifacts)); err != nil {
			t.Fatal(err)
		}
		all = append(all, ids(g.States)...)
	}
	if u, _ := m.Usage(); u.States != 0 || len(all) != 5 || u.Artifacts[ArtifactFS].Count+u.Artifacts[ArtifactProc].Count != 0 {
		t.Errorf("after bounded passes: %+v, collected %v", u, all)
	}
}

// TestOldStateRecord: a state record written before retention and pins
// (no closed_at, no pinned) reads as released with no retention.
func TestOldStateRecord(t *testing.T) {
	old := []byte(`{"id":"s1","env":"e1","turn":2,"kind":"full","fs":"f1","proc":"p1","created":"2026-01-01T00:00:00Z","released":true}`)
	s, err := decode[State]([]byte("s1"), old)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Released || s.Pinned || !s.ClosedAt.IsZero() {
		t.Fatalf("old record read as %+v", s)
	}
	if keep, _ := (Policy{Retain: time.Hour}).retained(s, time.Now()); keep {
		t.Error("an old released record is retained")
	}
	// New records leave the new fields out when they are zero.
	b, err := encode(State{ID: "s2", Env: "e1", Kind: state.Full})
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, "closed_at") || strings.Contains(s, "pinned") {
		t.Errorf("zero retention fields encoded: %s", s)
	}
}

// TestPinReleaseAtomic: an unknown id refuses the whole call.
func TestPinReleaseAtomic(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "e1")
	checkpoint(t, m, "e1", "r", "", 0, state.Full)
	for name, f := range map[string]func(...string) error{"pin": m.Pin, "unpin": m.Unpin, "release": m.Release} {
		if err := f("r", "nosuch"); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s with an unknown id: %v, want ErrNotFound", name, err)
		}
	}
	s, err := m.GetState("r")
	if err != nil || s.Pinned || s.Released {
		t.Errorf("refused calls changed the state: %+v %v", s, err)
	}
}

// TestEvictPolicy: under Evict the retention of closed lineages is
// ignored: Collect lists what is garbage anyway first, then the retained
// states by the close of their env, oldest first; pinned states, open
// lineages and Keep stay.
func TestEvictPolicy(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := openTest(t, Options{})
	for _, e := range []string{"open", "old", "new"} {
		putEnv(t, m, e)
	}
	checkpoint(t, m, "open", "o0", "", 0, state.Full)
	checkpoint(t, m, "open", "o1", "o0", 1, state.FS)
	checkpoint(t, m, "open", "o2", "o1", 2, state.Full)
	checkpoint(t, m, "new", "n0", "o1", 3, state.Full) // a branch of o1, newest state
	checkpoint(t, m, "new", "np", "n0", 4, state.Full) // pinned
	checkpoint(t, m, "new", "nk", "n0", 5, state.Full) // kept by the caller
	checkpoint(t, m, "old", "d0", "", 6, state.Full)   // made last, closed first
	checkpoint(t, m, "old", "d1", "d0", 7, state.Full) //
	checkpoint(t, m, "old", "dr", "d0", 8, state.Full) // released by name
	if err := m.Pin("np"); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseEnvAt("old", t0); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseEnvAt("new", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := m.Release("dr", "o1"); err != nil {
		t.Fatal(err)
	}
	p := Policy{Now: t0.Add(2 * time.Minute), Retain: time.Hour, Keep: []string{"nk"}}
	if g, err := m.Collect(p); err != nil || !reflect.DeepEqual(ids(g.States), []string{"dr"}) {
		t.Fatalf("without pressure: %v %v, want [dr]", ids(g.States), err)
	}
	p.Evict = true
	g, err := m.Collect(p)
	if err != nil {
		t.Fatal(err)
	}
	// dr is garbage anyway; then old's (closed at t0) oldest first, then
	// nothing of new: n0 is an ancestor of the pinned and the kept state.
	if want := []string{"dr", "d0", "d1"}; !reflect.DeepEqual(ids(g.States), want) {
		t.Fatalf("under pressure: %v, want %v", ids(g.States), want)
	}
	if err := m.ForgetWith(p, ids(g.States), artifactIDs(g.Artifacts)); err != nil {
		t.Fatal(err)
	}
	p.Keep = nil
	if g, err := m.Collect(p); err != nil || !reflect.DeepEqual(ids(g.States), []string{"nk"}) {
		t.Fatalf("once nk is no longer kept: %v %v, want [nk]", ids(g.States), err)
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestCheck: Check passes on a consistent manifest and reports a state
// whose artifact record is gone, an index entry without its state, and
// delta images whose chain of bases is broken (a base without a record,
// a loop).
func TestCheck(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "e1")
	checkpoint(t, m, "e1", "a", "", 0, state.Full)
	checkpoint(t, m, "e1", "b", "a", 1, state.FS)
	checkpoint(t, m, "e1", "c", "b", 2, state.Proc)
	checkpoint(t, m, "e1", "d", "c", 3, state.Proc)
	setBase(t, m, "proc-d", "proc-c")
	if err := m.Check(); err != nil {
		t.Fatalf("consistent manifest: %v", err)
	}
	setBase(t, m, "proc-d", "proc-gone")
	setBase(t, m, "proc-a", "proc-c")
	setBase(t, m, "proc-c", "proc-a")
	err := m.Check()
	for _, want := range []string{"artifact proc-d: base proc-gone missing", "artifact proc-a: base cycle at proc-a", "artifact proc-c: base cycle at proc-c"} {
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), want) {
			t.Fatalf("Check of broken delta chains: %v, want %q", err, want)
		}
	}
	setBase(t, m, "proc-d", "")
	setBase(t, m, "proc-a", "")
	setBase(t, m, "proc-c", "")
	if err := m.Check(); err != nil {
		t.Fatalf("chains mended: %v", err)
	}
	err = m.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketArtifacts).Delete([]byte("fs-b")); err != nil {
			return err
		}
		return tx.Bucket(bucketByEnv).Put(byEnvKey("e1", "ghost"), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Check()
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "fs artifact fs-b missing") || !strings.Contains(err.Error(), "ghost") {
		t.Fatalf("Check of a broken manifest: %v", err)
	}
}
