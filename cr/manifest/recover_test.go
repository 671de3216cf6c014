package manifest

import (
	"reflect"
	"testing"

	"github.com/arbor-env/arbor/state"
)

func TestRecover(t *testing.T) {
	// e1: r(full) - a(fs) - b(proc) - c(fs) - d(none)   head d
	// e2 (branch of b): x(full)                        head x
	setup := func(t *testing.T, m *Manifest) {
		putEnv(t, m, "e1")
		putEnv(t, m, "e2")
		checkpoint(t, m, "e1", "r", "", 0, state.Full)
		checkpoint(t, m, "e1", "a", "r", 1, state.FS)
		checkpoint(t, m, "e1", "b", "a", 2, state.Proc)
		checkpoint(t, m, "e1", "c", "b", 3, state.FS)
		checkpoint(t, m, "e1", "d", "c", 4, state.None)
		checkpoint(t, m, "e2", "x", "b", 3, state.Full)
	}
	tests := []struct {
		name        string
		act         func(t *testing.T, m *Manifest)
		gone        map[string]bool // artifact ids Exists reports absent
		wantHalf    []string
		wantMissing []string
		wantRemoved []string
		wantHeads   map[string]string
	}{
		{
			name:      "clean store",
			act:       func(*testing.T, *Manifest) {},
			wantHeads: map[string]string{"e1": "d", "e2": "x"},
		},
		{
			name: "half-written intents",
			act: func(t *testing.T, m *Manifest) {
				for _, a := range []Artifact{{ID: "h-fs", Kind: ArtifactFS}, {ID: "h-proc", Kind: ArtifactProc}} {
					if err := m.BeginArtifact(a); err != nil {
						t.Fatal(err)
					}
				}
			},
			gone:      map[string]bool{"h-proc": true}, // Exists is not asked about intents
			wantHalf:  []string{"h-fs", "h-proc"},
			wantHeads: map[string]string{"e1": "d", "e2": "x"},
		},
		{
			name:        "missing fs artifact removes the states using it",
			gone:        map[string]bool{"fs-c": true},
			wantMissing: []string{"fs-c"},
			wantRemoved: []string{"c", "d"},
			wantHeads:   map[string]string{"e1": "b", "e2": "x"},
		},
		{
			name:        "missing shared proc artifact reaches into the branch",
			gone:        map[string]bool{"proc-b": true},
			wantMissing: []string{"proc-b"},
			wantRemoved: []string{"b", "c", "d"},
			wantHeads:   map[string]string{"e1": "a", "e2": "x"},
		},
		{
			name:        "head falls back across removed ancestors into another env",
			gone:        map[string]bool{"proc-r": true, "proc-x": true},
			wantMissing: []string{"proc-r", "proc-x"},
			wantRemoved: []string{"a", "r", "x"},
			wantHeads:   map[string]string{"e1": "d", "e2": "b"},
		},
		{
			name: "missing root artifact empties the head",
			act: func(t *testing.T, m *Manifest) {
				putEnv(t, m, "e3")
				checkpoint(t, m, "e3", "z", "", 0, state.Full)
			},
			gone:        map[string]bool{"proc-z": true},
			wantMissing: []string{"proc-z"},
			wantRemoved: []string{"z"},
			wantHeads:   map[string]string{"e1": "d", "e2": "x", "e3": ""},
		},
		{
			// proc-x a delta of proc-b, itself one of proc-r: with
			// proc-r gone neither can be restored.
			name: "a missing base takes its deltas along",
			act: func(t *testing.T, m *Manifest) {
				setBase(t, m, "proc-x", "proc-b")
				setBase(t, m, "proc-b", "proc-r")
			},
			gone:        map[string]bool{"proc-r": true},
			wantMissing: []string{"proc-b", "proc-r", "proc-x"},
			wantRemoved: []string{"a", "b", "c", "d", "r", "x"},
			wantHeads:   map[string]string{"e1": "", "e2": ""},
		},
		{
			name: "intent and missing together",
			act: func(t *testing.T, m *Manifest) {
				if err := m.BeginArtifact(Artifact{ID: "fs-e", Kind: ArtifactFS}); err != nil {
					t.Fatal(err)
				}
			},
			gone:        map[string]bool{"fs-x": true},
			wantHalf:    []string{"fs-e"},
			wantMissing: []string{"fs-x"},
			wantRemoved: []string{"x"},
			wantHeads:   map[string]string{"e1": "d", "e2": "b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := openTest(t, Options{Exists: func(a Artifact) bool {
				if !a.Ready {
					t.Errorf("Exists asked about intent %s", a.ID)
				}
				return !tt.gone[a.ID]
			}})
			setup(t, m)
			if tt.act != nil {
				tt.act(t, m)
			}
			statesBefore, _ := m.Usage()
			rep, err := m.Recover()
			if err != nil {
				t.Fatal(err)
			}
			if got := artifactIDs(rep.HalfWritten); !reflect.DeepEqual(got, orEmpty(tt.wantHalf)) {
				t.Errorf("half-written %v, want %v", got, tt.wantHalf)
			}
			if got := artifactIDs(rep.Missing); !reflect.DeepEqual(got, orEmpty(tt.wantMissing)) {
				t.Errorf("missing %v, want %v", got, tt.wantMissing)
			}
			if got := orEmpty(rep.RemovedStates); !reflect.DeepEqual(got, orEmpty(tt.wantRemoved)) {
				t.Errorf("removed %v, want %v", got, tt.wantRemoved)
			}
			for env, want := range tt.wantHeads {
				if e, _ := m.GetEnv(env); e.Head != want {
					t.Errorf("head of %s = %q, want %q", env, e.Head, want)
				}
			}
			u, _ := m.Usage()
			if u.Intents != 0 || u.States != statesBefore.States-len(tt.wantRemoved) {
				t.Errorf("usage after recover %+v", u)
			}
			// Every surviving state's artifacts are ready and present.
			for _, env := range []string{"e1", "e2"} {
				ss, _ := m.States(env)
				for _, s := range ss {
					for _, id := range []string{s.FS, s.Proc} {
						if id == "" {
							continue
						}
						if a, err := m.GetArtifact(id); err != nil || !a.Ready || tt.gone[id] {
							t.Errorf("state %s keeps artifact %s: %+v %v", s.ID, id, a, err)
						}
					}
				}
			}
			// Recovery is idempotent.
			rep, err = m.Recover()
			if err != nil || len(rep.HalfWritten)+len(rep.Missing)+len(rep.RemovedStates) != 0 {
				t.Errorf("second Recover: %+v %v", rep, err)
			}
		})
	}
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
