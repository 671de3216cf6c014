package branch_test

import (
	"context"
	"sync"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/inspector/watch"
	"github.com/arbor-env/arbor/state"
)

// recordingInspector is the real Inspector, with the ids it tracks and
// the baselines it took recorded.
type recordingInspector struct {
	*watch.Inspector
	mu        sync.Mutex
	tracked   map[string]bool
	baselines map[string]int
}

func (r *recordingInspector) Track(id string, cg uint64) error {
	r.mu.Lock()
	r.tracked[id] = true
	r.mu.Unlock()
	return r.Inspector.Track(id, cg)
}

func (r *recordingInspector) Untrack(id string) {
	r.mu.Lock()
	delete(r.tracked, id)
	r.mu.Unlock()
	r.Inspector.Untrack(id)
}

func (r *recordingInspector) Baseline(ctx context.Context, id string, t inspector.Target, image *inspector.ShellState) error {
	r.mu.Lock()
	r.baselines[id]++
	r.mu.Unlock()
	return r.Inspector.Baseline(ctx, id, t, image)
}

func (r *recordingInspector) counts() (tracked, baselines int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.baselines {
		baselines += n
	}
	return len(r.tracked), baselines
}

// TestPreparedCopiesTrackedAhead: a prepared copy's Inspector baseline
// is taken when it is restored, before it is frozen, under the id of the
// env it becomes, so a branch that takes it only thaws it (docs/engine.md,
// "Warm copies"); its turns are then classified as a cold child's are,
// and checkpoints of them restore to what was live; a copy destroyed
// unused is no longer tracked.
func TestPreparedCopiesTrackedAhead(t *testing.T) {
	dir := t.TempDir()
	rec := &recordingInspector{Inspector: newInspector(t), tracked: map[string]bool{}, baselines: map[string]int{}}
	r := newRigOptions(t, newBtrfs(t, dir), dir, func(o *branch.Options) { o.Inspector = rec })
	e := r.e
	ctx := context.Background()
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "mkdir -p /work && echo past > /work/f && cd /work && X=past; sleep 1000 >/dev/null 2>&1 &")
	past, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "echo later > /work/f")
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	if res, err := e.Prepare(ctx, []string{past}, 3, true); err != nil || res.Ready[past] != 3 {
		t.Fatalf("prepare(3, wait): %+v, %v", res, err)
	}
	tracked, baselines := rec.counts()
	if tracked != 4 {
		t.Errorf("%d envs tracked after the prepare, want 4 (the env and its 3 copies)", tracked)
	}
	res, err := e.Branch(ctx, branch.Source{State: past}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := e.Usage(); u.Prepare.Taken != 2 {
		t.Fatalf("branch(2) took %d prepared copies, want 2", u.Prepare.Taken)
	}
	if _, after := rec.counts(); after != baselines {
		t.Errorf("branch(2) of prepared copies took %d baselines, want none", after-baselines)
	}
	for i, ch := range res.Children {
		if res.Errors[i] != nil {
			t.Fatalf("child %d: %v", i, res.Errors[i])
		}
		rec.mu.Lock()
		n := rec.baselines[ch.ID]
		rec.mu.Unlock()
		if n != 1 {
			t.Errorf("child %d (%s): %d baselines under its id, want 1 (its copy's)", i, ch.ID, n)
		}
	}
	child := res.Children[0]
	for _, tt := range []struct {
		cmd  string
		want state.Kind
	}{
		{"cat /work/f >/dev/null; ls / >/dev/null", state.None},
		{"echo new > /work/g", state.FS},
		{"Y=1; cd /", state.Proc},
		{"echo both > /work/h; cd /work", state.Full},
	} {
		run(t, e, child, tt.cmd)
		turn, err := e.Classify(ctx, child, tt.cmd)
		if err != nil {
			t.Fatal(err)
		}
		if turn.Kind != tt.want {
			t.Errorf("%q in a prepared child: classified %s (%v), want %s", tt.cmd, turn.Kind, turn.Reasons, tt.want)
		}
		if turn.Kind == state.None {
			continue
		}
		sid, _, err := e.CheckpointAsync(child, turn.Kind)
		if err != nil {
			t.Fatal(err)
		}
		v, err := e.Verify(ctx, child, sid)
		if err != nil {
			t.Fatalf("%q: verify: %v", tt.cmd, err)
		}
		if len(v.Misses) > 0 {
			t.Errorf("%q (%s): verification misses: %v", tt.cmd, turn.Kind, v.Misses)
		}
	}
	if got := run(t, e, child, `echo "$(pwd) $X $Y $(cat /work/f /work/g /work/h)"`); got != "/work past 1 past\nnew\nboth\n" {
		t.Errorf("the prepared child at the end: %q", got)
	}
	// The copy nobody took goes with the engine, and with it its
	// tracking; so do the envs'.
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if tracked, _ := rec.counts(); tracked != 0 {
		rec.mu.Lock()
		t.Errorf("still tracked after Close: %v", rec.tracked)
		rec.mu.Unlock()
	}
}
