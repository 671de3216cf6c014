package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/arbor-env/arbor/state"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func openTest(t *testing.T, opts Options) *Manifest {
	t.Helper()
	m, err := Open(filepath.Join(t.TempDir(), "manifest.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// checkpoint begins and commits the artifacts a state of kind k needs
// (fs and proc named after the state) and commits the state; for kind fs
// and none it reuses the parent's proc artifact, as the engine does.
func checkpoint(t *testing.T, m *Manifest, env, id, parent string, turn int, k state.Kind) State {
	t.Helper()
	s := State{ID: id, Env: env, Parent: parent, Turn: turn, Kind: k, Created: t0.Add(time.Duration(turn) * time.Second)}
	if parent != "" {
		p, err := m.GetState(parent)
		if err != nil {
			t.Fatal(err)
		}
		s.FS, s.Proc = p.FS, p.Proc
	}
	var ready []string
	if k == state.FS || k == state.Full {
		s.FS = "fs-" + id
		ready = append(ready, s.FS)
		if err := m.BeginArtifact(Artifact{ID: s.FS, Kind: ArtifactFS, Location: "snap/" + id, Bytes: 100}); err != nil {
			t.Fatal(err)
		}
	}
	if k == state.Proc || k == state.Full {
		s.Proc = "proc-" + id
		ready = append(ready, s.Proc)
		if err := m.BeginArtifact(Artifact{ID: s.Proc, Kind: ArtifactProc, Location: "img/" + id, Bytes: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.CommitState(s, ready...); err != nil {
		t.Fatal(err)
	}
	return s
}

func putEnv(t *testing.T, m *Manifest, id string) {
	t.Helper()
	if err := m.PutEnv(Env{ID: id, Image: "debian", Created: t0}); err != nil {
		t.Fatal(err)
	}
}

func ids(ss []State) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, s.ID)
	}
	return out
}

func artifactIDs(as []Artifact) []string {
	out := []string{}
	for _, a := range as {
		out = append(out, a.ID)
	}
	return out
}

func TestOpen(t *testing.T) {
	writeBolt := func(t *testing.T, path string, f func(tx *bolt.Tx) error) {
		t.Helper()
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(f); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
	setSchema := func(v string) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			writeBolt(t, path, func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists(bucketMeta)
				if err != nil {
					return err
				}
				return b.Put(keySchema, []byte(v))
			})
		}
	}
	tests := []struct {
		name    string
		prepare func(t *testing.T, path string)
		want    error
	}{
		{name: "new file", prepare: func(*testing.T, string) {}},
		{name: "empty bolt db", prepare: func(t *testing.T, path string) {
			writeBolt(t, path, func(*bolt.Tx) error { return nil })
		}},
		{name: "current schema", prepare: setSchema("1")},
		{name: "newer schema", prepare: setSchema("2"), want: ErrSchema},
		{name: "older schema", prepare: setSchema("0"), want: ErrSchema},
		{name: "unreadable schema", prepare: setSchema("one"), want: ErrSchema},
		{name: "foreign bolt db", prepare: func(t *testing.T, path string) {
			writeBolt(t, path, func(tx *bolt.Tx) error {
				_, err := tx.CreateBucket([]byte("other"))
				return err
			})
		}, want: ErrSchema},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.db")
			tt.prepare(t, path)
			m, err := Open(path, Options{})
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("Open: got %v, want %v", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.PutEnv(Env{ID: "e"}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestOpenLocked(t *testing.T) {
	m := openTest(t, Options{})
	start := time.Now()
	_, err := Open(m.Path(), Options{LockTimeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: got %v, want ErrLocked", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("second Open took %s", d)
	}
}

func TestReopenKeepsData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	m, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	putEnv(t, m, "e1")
	s := checkpoint(t, m, "e1", "s1", "", 0, state.Full)
	m.Close()
	m, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got, err := m.GetState("s1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Errorf("state after reopen: got %+v, want %+v", got, s)
	}
}

func TestRoundTrip(t *testing.T) {
	m := openTest(t, Options{})
	env := Env{ID: "e1", Image: "debian:12", Created: t0, Origin: "e9", Labels: map[string]string{"task": "t"}}
	fs := Artifact{ID: "a-fs", Kind: ArtifactFS, Location: "snap/1", Bytes: 4096, Created: t0}
	proc := Artifact{ID: "a-proc", Kind: ArtifactProc, Location: "img/1", Bytes: 1 << 20, Created: t0}
	st := State{
		ID: "s1", Env: "e1", Turn: 3, Kind: state.Full, FS: "a-fs", Proc: "a-proc", Created: t0,
		Timings: map[string]time.Duration{"freeze": time.Millisecond, "dump": 42 * time.Millisecond},
	}
	tests := []struct {
		name string
		put  func() error
		get  func() (any, error)
		want any
	}{
		{name: "env", put: func() error { return m.PutEnv(env) },
			get: func() (any, error) { return m.GetEnv("e1") }, want: env},
		{name: "fs intent", put: func() error { return m.BeginArtifact(fs) },
			get: func() (any, error) { return m.GetArtifact("a-fs") }, want: fs},
		{name: "proc intent", put: func() error { return m.BeginArtifact(proc) },
			get: func() (any, error) { return m.GetArtifact("a-proc") }, want: proc},
		{name: "state", put: func() error { return m.CommitState(st, "a-fs", "a-proc") },
			get: func() (any, error) { return m.GetState("s1") }, want: st},
		{name: "artifact ready after commit", put: func() error { return nil },
			get:  func() (any, error) { return m.GetArtifact("a-proc") },
			want: Artifact{ID: "a-proc", Kind: ArtifactProc, Location: "img/1", Bytes: 1 << 20, Created: t0, Ready: true}},
		{name: "head moved", put: func() error { return nil },
			get:  func() (any, error) { return m.GetEnv("e1") },
			want: Env{ID: "e1", Image: "debian:12", Created: t0, Head: "s1", Origin: "e9", Labels: map[string]string{"task": "t"}}},
		{name: "labels merged", put: func() error { return m.SetLabels("e1", map[string]string{"base": "3", "task": ""}) },
			get: func() (any, error) { e, err := m.GetEnv("e1"); return e.Labels, err }, want: map[string]string{"base": "3"}},
		{name: "artifact bytes", put: func() error { return m.SetArtifactBytes("a-fs", 7) },
			get: func() (any, error) { a, err := m.GetArtifact("a-fs"); return a.Bytes, err }, want: int64(7)},
		{name: "close env", put: func() error { return m.CloseEnv("e1") },
			get: func() (any, error) { e, err := m.GetEnv("e1"); return e.Closed, err }, want: true},
		{name: "envs", put: func() error { return m.PutEnv(Env{ID: "e0", Created: t0}) },
			get: func() (any, error) {
				es, err := m.Envs()
				var out []string
				for _, e := range es {
					out = append(out, e.ID)
				}
				return out, err
			}, want: []string{"e0", "e1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.put(); err != nil {
				t.Fatal(err)
			}
			got, err := tt.get()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestLabelsSurviveReopen: the labels an owner set are what a restarted
// process reads back, after Recover; a closed env takes no labels.
func TestLabelsSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	m, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	putEnv(t, m, "e1")
	checkpoint(t, m, "e1", "s1", "", 1, state.Full)
	want := map[string]string{"task": "hello", "base": "1"}
	if err := m.SetLabels("e1", want); err != nil {
		t.Fatal(err)
	}
	if err := m.SetLabels("e1", map[string]string{"": "x"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty label key: %v, want ErrInvalid", err)
	}
	m.Close()
	if m, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	e, err := m.GetEnv("e1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(e.Labels, want) || e.Head != "s1" || e.Closed {
		t.Errorf("env after reopen and recover: %+v, want labels %v head s1 open", e, want)
	}
	if err := m.CloseEnv("e1"); err != nil {
		t.Fatal(err)
	}
	if err := m.SetLabels("e1", map[string]string{"a": "b"}); !errors.Is(err, ErrClosed) {
		t.Errorf("labels on a closed env: %v, want ErrClosed", err)
	}
	if err := m.SetLabels("nope", map[string]string{"a": "b"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("labels on an unknown env: %v, want ErrNotFound", err)
	}
}

// TestMarkLost: a lost env is closed with its reason and keeps its
// states; releasing it clears the reason.
func TestMarkLost(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "e1")
	checkpoint(t, m, "e1", "s1", "", 1, state.Full)
	if err := m.MarkLost("e1", "restore failed"); err != nil {
		t.Fatal(err)
	}
	e, err := m.GetEnv("e1")
	if err != nil || !e.Closed || e.Lost != "restore failed" {
		t.Fatalf("lost env: %+v %v", e, err)
	}
	if s, err := m.GetState("s1"); err != nil || s.Released {
		t.Errorf("state of a lost env: %+v %v, want kept", s, err)
	}
	if err := m.ReleaseEnvAt("e1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if e, err = m.GetEnv("e1"); err != nil || e.Lost != "" {
		t.Errorf("released lost env: %+v %v, want no reason", e, err)
	}
	if s, err := m.GetState("s1"); err != nil || !s.Released {
		t.Errorf("state of a released lost env: %+v %v, want released", s, err)
	}
	if err := m.MarkLost("nope", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("MarkLost of an unknown env: %v", err)
	}
}

func TestNotFound(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "e1")
	tests := []struct {
		name string
		call func() error
	}{
		{"get state", func() error { _, err := m.GetState("x"); return err }},
		{"get env", func() error { _, err := m.GetEnv("x"); return err }},
		{"get artifact", func() error { _, err := m.GetArtifact("x"); return err }},
		{"states", func() error { _, err := m.States("x"); return err }},
		{"lineage", func() error { _, err := m.Lineage("x"); return err }},
		{"release", func() error { return m.Release("x") }},
		{"release env", func() error { return m.ReleaseEnvAt("x", time.Now()) }},
		{"close env", func() error { return m.CloseEnv("x") }},
		{"set head env", func() error { return m.SetHead("x", "y") }},
		{"set head state", func() error { return m.SetHead("e1", "y") }},
		{"abort", func() error { return m.AbortArtifact("x") }},
		{"put env head", func() error { return m.PutEnv(Env{ID: "e2", Head: "x"}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, ErrNotFound) {
				t.Errorf("got %v, want ErrNotFound", err)
			}
		})
	}
}

func TestArtifactLifecycle(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "e1")
	a := Artifact{ID: "a1", Kind: ArtifactFS}
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"begin", func() error { return m.BeginArtifact(a) }, nil},
		{"begin twice", func() error { return m.BeginArtifact(a) }, ErrExists},
		{"begin empty id", func() error { return m.BeginArtifact(Artifact{Kind: ArtifactFS}) }, ErrInvalid},
		{"begin bad kind", func() error { return m.BeginArtifact(Artifact{ID: "a2", Kind: "disk"}) }, ErrInvalid},
		{"begin ready is forced to intent", func() error {
			if err := m.BeginArtifact(Artifact{ID: "a3", Kind: ArtifactFS, Ready: true}); err != nil {
				return err
			}
			if got, _ := m.GetArtifact("a3"); got.Ready {
				return errors.New("intent recorded as ready")
			}
			return nil
		}, nil},
		{"abort intent", func() error { return m.AbortArtifact("a1") }, nil},
		{"abort gone", func() error { return m.AbortArtifact("a1") }, ErrNotFound},
		{"abort committed", func() error {
			if err := m.CommitState(State{ID: "s", Env: "e1", Kind: state.FS, FS: "a3"}, "a3"); err != nil {
				return err
			}
			return m.AbortArtifact("a3")
		}, ErrInUse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
}

// TestCommitStateAtomic checks that a refused CommitState writes nothing:
// no state, no index entry, no head move, and no artifact marked ready.
func TestCommitStateAtomic(t *testing.T) {
	tests := []struct {
		name  string
		state State
		ready []string
		want  error
	}{
		{name: "fs artifact missing", state: State{ID: "n", Env: "e1", Kind: state.FS, FS: "nope"}, ready: []string{"i-fs"}, want: ErrNotFound},
		{name: "fs artifact not ready", state: State{ID: "n", Env: "e1", Kind: state.Full, FS: "i-fs", Proc: "i-proc"}, ready: []string{"i-proc"}, want: ErrNotFound},
		{name: "proc artifact not ready", state: State{ID: "n", Env: "e1", Kind: state.Proc, Proc: "i-proc"}, ready: []string{"i-fs"}, want: ErrNotFound},
		{name: "ready lists a missing artifact", state: State{ID: "n", Env: "e1", Kind: state.FS, FS: "i-fs"}, ready: []string{"i-fs", "nope"}, want: ErrNotFound},
		{name: "artifact of the wrong kind", state: State{ID: "n", Env: "e1", Kind: state.FS, FS: "i-proc"}, ready: []string{"i-proc"}, want: ErrInvalid},
		{name: "duplicate state", state: State{ID: "s0", Env: "e1", Kind: state.FS, FS: "i-fs"}, ready: []string{"i-fs"}, want: ErrExists},
		{name: "env missing", state: State{ID: "n", Env: "e9", Kind: state.FS, FS: "i-fs"}, ready: []string{"i-fs"}, want: ErrNotFound},
		{name: "env closed", state: State{ID: "n", Env: "closed", Kind: state.FS, FS: "i-fs"}, ready: []string{"i-fs"}, want: ErrClosed},
		{name: "parent missing", state: State{ID: "n", Env: "e1", Parent: "p9", Kind: state.FS, FS: "i-fs"}, ready: []string{"i-fs"}, want: ErrNotFound},
		{name: "unknown kind", state: State{ID: "n", Env: "e1", Kind: "half", FS: "i-fs"}, ready: []string{"i-fs"}, want: ErrInvalid},
		{name: "full without proc", state: State{ID: "n", Env: "e1", Kind: state.Full, FS: "i-fs"}, ready: []string{"i-fs"}, want: ErrInvalid},
		{name: "empty id", state: State{Env: "e1", Kind: state.None}, want: ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := openTest(t, Options{})
			putEnv(t, m, "e1")
			putEnv(t, m, "closed")
			checkpoint(t, m, "e1", "s0", "", 0, state.Full)
			if err := m.CloseEnv("closed"); err != nil {
				t.Fatal(err)
			}
			for _, a := range []Artifact{{ID: "i-fs", Kind: ArtifactFS}, {ID: "i-proc", Kind: ArtifactProc}} {
				if err := m.BeginArtifact(a); err != nil {
					t.Fatal(err)
				}
			}
			before, err := m.Usage()
			if err != nil {
				t.Fatal(err)
			}
			err = m.CommitState(tt.state, tt.ready...)
			if !errors.Is(err, tt.want) {
				t.Fatalf("CommitState: got %v, want %v", err, tt.want)
			}
			after, err := m.Usage()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(before, after) {
				t.Errorf("usage changed: %+v -> %+v", before, after)
			}
			if _, err := m.GetState("n"); !errors.Is(err, ErrNotFound) {
				t.Errorf("refused state stored: %v", err)
			}
			for _, id := range []string{"i-fs", "i-proc"} {
				if a, err := m.GetArtifact(id); err != nil || a.Ready {
					t.Errorf("artifact %s after refused commit: %+v, %v", id, a, err)
				}
			}
			if e, _ := m.GetEnv("e1"); e.Head != "s0" {
				t.Errorf("head moved to %q", e.Head)
			}
			if ss, _ := m.States("e1"); len(ss) != 1 {
				t.Errorf("states of e1: %v", ids(ss))
			}
		})
	}
}

func TestLineageAndStates(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "e1")
	putEnv(t, m, "e2")
	checkpoint(t, m, "e1", "r", "", 0, state.Full)
	checkpoint(t, m, "e1", "a", "r", 1, state.FS)
	checkpoint(t, m, "e1", "b", "a", 2, state.Proc)
	// Rollback to a and continue: b2 has the same turn as b, created later.
	if err := m.SetHead("e1", "a"); err != nil {
		t.Fatal(err)
	}
	b2 := State{ID: "b2", Env: "e1", Parent: "a", Turn: 2, Kind: state.None, FS: "fs-a", Proc: "proc-r", Created: t0.Add(time.Hour)}
	if err := m.CommitState(b2); err != nil {
		t.Fatal(err)
	}
	// A branch of b into e2.
	checkpoint(t, m, "e2", "c", "b", 3, state.Full)

	tests := []struct {
		name string
		got  func() ([]State, error)
		want []string
	}{
		{"lineage of root", func() ([]State, error) { return m.Lineage("r") }, []string{"r"}},
		{"lineage of b", func() ([]State, error) { return m.Lineage("b") }, []string{"r", "a", "b"}},
		{"lineage after rollback", func() ([]State, error) { return m.Lineage("b2") }, []string{"r", "a", "b2"}},
		{"lineage across a branch", func() ([]State, error) { return m.Lineage("c") }, []string{"r", "a", "b", "c"}},
		{"states by turn then creation", func() ([]State, error) { return m.States("e1") }, []string{"r", "a", "b", "b2"}},
		{"states of the branch", func() ([]State, error) { return m.States("e2") }, []string{"c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.got()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(ids(got), tt.want) {
				t.Errorf("got %v, want %v", ids(got), tt.want)
			}
		})
	}
	// The pairing of newest artifacts: b (proc only) keeps a's fs artifact.
	b, _ := m.GetState("b")
	if b.FS != "fs-a" || b.Proc != "proc-b" {
		t.Errorf("b pairs %s/%s, want fs-a/proc-b", b.FS, b.Proc)
	}
	if e, _ := m.GetEnv("e1"); e.Head != "b2" {
		t.Errorf("head of e1 = %s, want b2", e.Head)
	}
}

func TestUsage(t *testing.T) {
	m := openTest(t, Options{})
	putEnv(t, m, "e1")
	checkpoint(t, m, "e1", "r", "", 0, state.Full)
	checkpoint(t, m, "e1", "a", "r", 1, state.FS)
	if err := m.BeginArtifact(Artifact{ID: "pending", Kind: ArtifactProc, Bytes: 5}); err != nil {
		t.Fatal(err)
	}
	got, err := m.Usage()
	if err != nil {
		t.Fatal(err)
	}
	want := Usage{
		Artifacts: map[ArtifactKind]KindUsage{ArtifactFS: {Count: 2, Bytes: 200}, ArtifactProc: {Count: 1, Bytes: 1000}},
		Intents:   1, States: 2, Envs: 1,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestConcurrent(t *testing.T) {
	m := openTest(t, Options{})
	const workers, turns = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers*2)
	for w := range workers {
		env := fmt.Sprintf("e%d", w)
		putEnv(t, m, env)
		wg.Add(2)
		go func() {
			defer wg.Done()
			parent := ""
			for i := range turns {
				id := fmt.Sprintf("%s-s%d", env, i)
				a := Artifact{ID: "fs-" + id, Kind: ArtifactFS, Bytes: 1}
				if err := m.BeginArtifact(a); err != nil {
					errs <- err
					return
				}
				if err := m.CommitState(State{ID: id, Env: env, Parent: parent, Turn: i, Kind: state.FS, FS: a.ID}, a.ID); err != nil {
					errs <- err
					return
				}
				if i%5 == 4 {
					if err := m.Release(parent); err != nil {
						errs <- err
						return
					}
				}
				parent = id
			}
		}()
		go func() {
			defer wg.Done()
			for range turns {
				if _, _, err := m.Garbage(); err != nil {
					errs <- err
					return
				}
				if _, err := m.Usage(); err != nil {
					errs <- err
					return
				}
				if _, err := m.States(env); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	u, err := m.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.States != workers*turns || u.Artifacts[ArtifactFS].Count != workers*turns {
		t.Errorf("usage %+v, want %d states and fs artifacts", u, workers*turns)
	}
	for w := range workers {
		line, err := m.Lineage(fmt.Sprintf("e%d-s%d", w, turns-1))
		if err != nil || len(line) != turns {
			t.Errorf("lineage of e%d: %d states, %v", w, len(line), err)
		}
	}
	// Released states are ancestors of their envs' heads: nothing is garbage.
	if gs, ga, err := m.Garbage(); err != nil || len(gs)+len(ga) != 0 {
		t.Errorf("garbage %v %v %v", ids(gs), artifactIDs(ga), err)
	}
}

// FuzzDecode feeds arbitrary bytes to the record decoder: it must not
// panic, and whatever it accepts must survive a round trip.
func FuzzDecode(f *testing.F) {
	s, _ := json.Marshal(State{ID: "s1", Env: "e", Kind: state.Full, FS: "a", Proc: "b", Created: t0,
		Timings: map[string]time.Duration{"dump": 3}})
	a, _ := json.Marshal(Artifact{ID: "s1", Kind: ArtifactFS, Ready: true, Created: t0})
	e, _ := json.Marshal(Env{ID: "s1", Head: "x"})
	for _, seed := range [][]byte{s, a, e, []byte(`{"id":"s1","created":"bogus"}`), []byte(`null`), nil} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzRoundTrip[State](t, b)
		fuzzRoundTrip[Artifact](t, b)
		fuzzRoundTrip[Env](t, b)
	})
}

func fuzzRoundTrip[T record](t *testing.T, b []byte) {
	v, err := decode[T]([]byte("s1"), b)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode error not ErrCorrupt: %v", err)
		}
		return
	}
	enc, err := encode(v)
	if err != nil {
		// Accepted input that cannot be re-encoded (e.g. a year > 9999).
		return
	}
	v2, err := decode[T]([]byte("s1"), enc)
	if err != nil {
		t.Fatalf("re-decode %s: %v", enc, err)
	}
	enc2, _ := encode(v2)
	if string(enc) != string(enc2) {
		t.Fatalf("round trip changed %s to %s", enc, enc2)
	}
}
