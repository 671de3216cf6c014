package manifest

import (
	"time"

	"errors"
	"reflect"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/arbor-env/arbor/state"
)

func TestGarbageAndForget(t *testing.T) {
	// Every case starts from this tree:
	//
	//   e1: r(full) - a(fs) - b(proc) - c(fs)      head c
	//                    \
	//   e2 (branch of a):  x(full) - y(fs)           head y
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
	tests := []struct {
		name          string
		act           func(t *testing.T, m *Manifest)
		wantStates    []string
		wantArtifacts []string
	}{
		{name: "nothing released", act: func(*testing.T, *Manifest) {}, wantStates: []string{}, wantArtifacts: []string{}},
		{
			name: "released ancestors of live states stay",
			act: func(t *testing.T, m *Manifest) {
				for _, id := range []string{"r", "a", "b", "x"} {
					if err := m.Release(id); err != nil {
						t.Fatal(err)
					}
				}
			},
			wantStates: []string{}, wantArtifacts: []string{},
		},
		{
			name: "released head of an open env stays, with its ancestors",
			act: func(t *testing.T, m *Manifest) {
				for _, id := range []string{"x", "y"} {
					if err := m.Release(id); err != nil {
						t.Fatal(err)
					}
				}
			},
			wantStates: []string{}, wantArtifacts: []string{},
		},
		{
			name: "released branch after close: its own states and artifacts go",
			act: func(t *testing.T, m *Manifest) {
				if err := m.ReleaseEnvAt("e2", time.Now()); err != nil {
					t.Fatal(err)
				}
			},
			wantStates: []string{"x", "y"}, wantArtifacts: []string{"fs-x", "fs-y", "proc-x"},
		},
		{
			name: "released parent env: the branch keeps r and a alive",
			act: func(t *testing.T, m *Manifest) {
				if err := m.ReleaseEnvAt("e1", time.Now()); err != nil {
					t.Fatal(err)
				}
			},
			// c pairs fs-c with proc-b; b and c go, r's proc and a's fs stay for x's ancestors.
			wantStates: []string{"b", "c"}, wantArtifacts: []string{"fs-c", "proc-b"},
		},
		{
			name: "rollback then release: the abandoned tail goes",
			act: func(t *testing.T, m *Manifest) {
				if err := m.SetHead("e1", "a"); err != nil {
					t.Fatal(err)
				}
				for _, id := range []string{"b", "c"} {
					if err := m.Release(id); err != nil {
						t.Fatal(err)
					}
				}
			},
			wantStates: []string{"b", "c"}, wantArtifacts: []string{"fs-c", "proc-b"},
		},
		{
			name: "closed env's head no longer protects",
			act: func(t *testing.T, m *Manifest) {
				if err := m.Release("y"); err != nil {
					t.Fatal(err)
				}
				if err := m.CloseEnv("e2"); err != nil {
					t.Fatal(err)
				}
			},
			wantStates: []string{"y"}, wantArtifacts: []string{"fs-y"},
		},
		{
			name: "everything released and closed",
			act: func(t *testing.T, m *Manifest) {
				for _, e := range []string{"e1", "e2"} {
					if err := m.ReleaseEnvAt(e, time.Now()); err != nil {
						t.Fatal(err)
					}
				}
			},
			wantStates:    []string{"a", "b", "c", "r", "x", "y"},
			wantArtifacts: []string{"fs-a", "fs-c", "fs-r", "fs-x", "fs-y", "proc-b", "proc-r", "proc-x"},
		},
		{
			name: "orphan ready artifact goes, intent stays",
			act: func(t *testing.T, m *Manifest) {
				for _, id := range []string{"orphan", "intent"} {
					if err := m.BeginArtifact(Artifact{ID: id, Kind: ArtifactFS}); err != nil {
						t.Fatal(err)
					}
				}
				// Marked ready by a commit that does not reference it.
				if err := m.CommitState(State{ID: "d", Env: "e1", Parent: "c", Turn: 4, Kind: state.None, FS: "fs-c", Proc: "proc-b"}, "orphan"); err != nil {
					t.Fatal(err)
				}
			},
			wantStates: []string{}, wantArtifacts: []string{"orphan"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := openTest(t, Options{})
			setup(t, m)
			tt.act(t, m)
			gs, ga, err := m.Garbage()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(ids(gs), tt.wantStates) || !reflect.DeepEqual(artifactIDs(ga), tt.wantArtifacts) {
				t.Fatalf("garbage: states %v artifacts %v, want %v %v", ids(gs), artifactIDs(ga), tt.wantStates, tt.wantArtifacts)
			}
			before, _ := m.Usage()
			if err := m.ForgetWith(Policy{}, ids(gs), artifactIDs(ga)); err != nil {
				t.Fatal(err)
			}
			after, _ := m.Usage()
			if after.States != before.States-len(gs) {
				t.Errorf("states %d -> %d after forgetting %d", before.States, after.States, len(gs))
			}
			if gs, ga, err := m.Garbage(); err != nil || len(gs)+len(ga) != 0 {
				t.Errorf("garbage after Forget: %v %v %v", ids(gs), artifactIDs(ga), err)
			}
			// Every surviving state still has its artifacts and an unbroken lineage.
			for _, e := range []string{"e1", "e2"} {
				ss, err := m.States(e)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range ss {
					for _, a := range []string{s.FS, s.Proc} {
						if a == "" {
							continue
						}
						if got, err := m.GetArtifact(a); err != nil || !got.Ready {
							t.Errorf("state %s: artifact %s: %+v %v", s.ID, a, got, err)
						}
					}
				}
				if env, _ := m.GetEnv(e); env.Head != "" && !env.Closed {
					line, err := m.Lineage(env.Head)
					if err != nil || line[0].ID != "r" {
						t.Errorf("lineage of head %s: %v %v", env.Head, ids(line), err)
					}
				}
			}
			// A retry of the same Forget is harmless.
			if err := m.ForgetWith(Policy{}, ids(gs), artifactIDs(ga)); err != nil {
				t.Errorf("repeated Forget: %v", err)
			}
		})
	}
}

func TestForgetRefusesLive(t *testing.T) {
	tests := []struct {
		name      string
		states    []string
		artifacts []string
	}{
		{name: "unreleased state", states: []string{"c"}},
		{name: "released ancestor of a live state", states: []string{"a"}},
		{name: "artifact of a live state", artifacts: []string{"fs-a"}},
		{name: "artifact shared with a surviving state", states: []string{"c"}, artifacts: []string{"proc-b"}},
		{name: "intent", artifacts: []string{"intent"}},
		{name: "garbage mixed with live", states: []string{"x", "a"}, artifacts: []string{"fs-x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := openTest(t, Options{})
			putEnv(t, m, "e1")
			putEnv(t, m, "e2")
			checkpoint(t, m, "e1", "r", "", 0, state.Full)
			checkpoint(t, m, "e1", "a", "r", 1, state.FS)
			checkpoint(t, m, "e1", "b", "a", 2, state.Proc)
			checkpoint(t, m, "e1", "c", "b", 3, state.FS)
			checkpoint(t, m, "e2", "x", "r", 1, state.Full)
			if err := m.BeginArtifact(Artifact{ID: "intent", Kind: ArtifactFS}); err != nil {
				t.Fatal(err)
			}
			if err := m.ReleaseEnvAt("e2", time.Now()); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"a", "b"} {
				if err := m.Release(id); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := m.Usage()
			if err := m.ForgetWith(Policy{}, tt.states, tt.artifacts); !errors.Is(err, ErrInUse) {
				t.Fatalf("Forget: got %v, want ErrInUse", err)
			}
			if after, _ := m.Usage(); !reflect.DeepEqual(before, after) {
				t.Errorf("refused Forget changed usage: %+v -> %+v", before, after)
			}
		})
	}
}

// TestDeltaBaseKept: a delta image's base (Artifact.Base) is in use while
// the delta is, even when no state of its own needs it any more (here the
// delta's state has no parent, as an imported one), along the whole
// chain; once the delta goes, the chain goes with it. SetArtifactDelta
// takes only an intent with a ready process artifact as its base.
func TestDeltaBaseKept(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "e0")
	putEnv(t, m, "e1")
	checkpoint(t, m, "e0", "r", "", 0, state.Full)
	checkpoint(t, m, "e0", "q", "r", 1, state.Proc)
	// proc-q a delta of proc-r, made by hand as the engine does.
	if err := m.BeginArtifact(Artifact{ID: "proc-d", Kind: ArtifactProc, Location: "img/d"}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetArtifactDelta("proc-d", "fs-r", 10, 1000); err == nil {
		t.Fatal("SetArtifactDelta with a filesystem artifact as base: no error")
	}
	if err := m.SetArtifactDelta("proc-d", "proc-q", 10, 1000); err != nil {
		t.Fatal(err)
	}
	if err := m.CommitState(State{ID: "d", Env: "e1", Kind: state.Full, FS: "fs-r", Proc: "proc-d", Created: t0.Add(5 * time.Second)}, "proc-d"); err != nil {
		t.Fatal(err)
	}
	if err := m.SetArtifactDelta("proc-d", "proc-q", 10, 1000); !errors.Is(err, ErrInUse) {
		t.Fatalf("SetArtifactDelta of a ready artifact: %v, want ErrInUse", err)
	}
	// proc-q itself a delta of proc-r: set on the record directly.
	setBase(t, m, "proc-q", "proc-r")
	if err := m.ReleaseEnvAt("e0", time.Now()); err != nil {
		t.Fatal(err)
	}
	states, arts, err := m.Garbage()
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(states); !reflect.DeepEqual(got, []string{"q", "r"}) {
		t.Fatalf("garbage states %v, want q and r", got)
	}
	// fs-r is d's, proc-q d's base, proc-r proc-q's base: none may go.
	if got := artifactIDs(arts); len(got) != 0 {
		t.Fatalf("garbage artifacts %v, want none (d uses them all)", got)
	}
	if err := m.ForgetWith(Policy{}, nil, []string{"proc-r"}); !errors.Is(err, ErrInUse) {
		t.Fatalf("Forget of the chain's root: %v, want ErrInUse", err)
	}
	if err := m.ForgetWith(Policy{}, []string{"q", "r"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseEnvAt("e1", time.Now()); err != nil {
		t.Fatal(err)
	}
	_, arts, err = m.Garbage()
	if err != nil {
		t.Fatal(err)
	}
	if got := artifactIDs(arts); !reflect.DeepEqual(got, []string{"fs-r", "proc-d", "proc-q", "proc-r"}) {
		t.Fatalf("garbage artifacts after d's release %v, want the whole chain and fs-r", got)
	}
}

func setBase(t *testing.T, m *Manifest, id, base string) {
	t.Helper()
	err := m.db.Update(func(tx *bolt.Tx) error {
		a, err := get[Artifact](tx, bucketArtifacts, "artifact", id)
		if err != nil {
			return err
		}
		a.Base = base
		return put(tx, bucketArtifacts, a)
	})
	if err != nil {
		t.Fatal(err)
	}
}
