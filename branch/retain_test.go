package branch_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

func execOpts() sandbox.ExecOptions { return sandbox.ExecOptions{Timeout: 20 * time.Second} }

// retainRig is a rig whose engine keeps closed lineages for retain.
func retainRig(t *testing.T, retain time.Duration, adjust func(*branch.Options)) *rig {
	t.Helper()
	dir := t.TempDir()
	return newRigOptions(t, newBtrfs(t, dir), dir, func(o *branch.Options) {
		o.Retain = retain
		if adjust != nil {
			adjust(o)
		}
	})
}

// numbered makes a busybox env and n states after it (full checkpoints),
// state i (1..n) with /f holding i; it returns the env and the states,
// the env's first state at index 0.
func numbered(t *testing.T, e *branch.Engine, n int) (*branch.Env, []string) {
	t.Helper()
	ctx := context.Background()
	env, s0, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	sids := []string{s0}
	for i := 1; i <= n; i++ {
		run(t, e, env, "echo "+strconv.Itoa(i)+" > /f")
		sid, err := e.Checkpoint(ctx, env, state.Full)
		if err != nil {
			t.Fatal(err)
		}
		sids = append(sids, sid)
	}
	return env, sids
}

// branchCheck branches one child from sid, checks that its /f says want
// ("" for no /f: an env's first state) and closes it; it returns the
// state the child made.
func branchCheck(t *testing.T, e *branch.Engine, sid, want string) string {
	t.Helper()
	ctx := context.Background()
	res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err == nil {
		err = res.Errors[0]
	}
	if err != nil {
		t.Fatalf("branch from %s: %v", sid, err)
	}
	child := res.Children[0]
	defer e.CloseEnv(ctx, child)
	if got := strings.TrimSpace(run(t, e, child, "cat /f 2>/dev/null; true")); got != want {
		t.Errorf("branch from %s: /f = %q, want %q", sid, got, want)
	}
	// The child moves on to a state of its own before it closes, so that
	// nothing of sid stays with the child (its head).
	run(t, e, child, "echo child > /g")
	own, err := e.Checkpoint(ctx, child, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	return own
}

// gone reports whether every state of sids is unknown to e.
func gone(e *branch.Engine, sids ...string) bool {
	for _, sid := range sids {
		if _, err := e.State(sid); !errors.Is(err, state.ErrUnknownState) {
			return false
		}
	}
	return true
}

// exists fails the test unless every state of sids exists.
func exists(t *testing.T, e *branch.Engine, what string, sids ...string) {
	t.Helper()
	for _, sid := range sids {
		if _, err := e.State(sid); err != nil {
			t.Errorf("%s: state %s: %v", what, sid, err)
		}
	}
}

// waitPasses waits until the background GC has run n more passes than
// it had when called: what it decides has then been decided. It nudges
// the GC while it waits: the passes a close nudged may be over already,
// and the next timed one is GCInterval (a minute) away.
func waitPasses(t *testing.T, e *branch.Engine, n int64) {
	t.Helper()
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	from := u.GC.Passes
	branchtest.WaitFor(t, fmt.Sprintf("%d GC passes", n), func() bool {
		branch.NudgeGC(e)
		u, err := e.Usage()
		return err == nil && u.GC.Passes >= from+n
	})
}

// TestRetention: the states of a closed env stay branchable for Retain
// (here an hour, on the engine's clock, which the test moves on) and the
// background GC removes them, with their artifacts, once it is over.
func TestRetention(t *testing.T) {
	r := retainRig(t, time.Hour, nil)
	ctx := context.Background()
	e := r.e
	env, sids := numbered(t, e, 3)
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	waitPasses(t, e, 1) // the background GC, nudged by the close, too
	for i, sid := range sids {
		want := ""
		if i > 0 {
			want = strconv.Itoa(i)
		}
		branchCheck(t, e, sid, want)
	}
	exists(t, e, "closed lineage within its retention", sids...)

	branch.AdvanceClock(e, time.Hour+time.Second)
	branchtest.WaitFor(t, "the background GC to remove the closed lineage", func() bool { return gone(e, sids...) })
	// The children's states went with the retention too, so nothing is
	// left at all, not even the closed envs' records.
	branchtest.WaitFor(t, "every artifact and env record removed", func() bool {
		u, err := e.Usage()
		vols, _ := r.snap.List(ctx, branch.SnapshotPrefix)
		return err == nil && u.Manifest.States == 0 && u.Images.HotCount+u.Images.ColdCount == 0 && len(vols) == 0 && u.Manifest.Envs == 0 &&
			u.Manifest.Artifacts[manifest.ArtifactFS].Count+u.Manifest.Artifacts[manifest.ArtifactProc].Count == 0
	})
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.GC.States < int64(len(sids)) || u.GC.Artifacts < int64(2*len(sids)) || u.GC.Passes < 2 || u.GC.Errors != 0 {
		t.Errorf("GC stats %+v, want at least %d states and %d artifacts deleted, no errors", u.GC, len(sids), 2*len(sids))
	}
	if _, err := e.Branch(ctx, branch.Source{State: sids[1]}, 1); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("branch from a state past its retention: %v, want state.ErrUnknownState", err)
	}
}

// TestRetentionEnds: with a retention of 1 s on the wall clock, the
// background GC removes a closed env's states by itself after it (no
// nudge, no explicit GC), within a deadline.
func TestRetentionEnds(t *testing.T) {
	r := retainRig(t, time.Second, nil)
	ctx := context.Background()
	e := r.e
	env, sids := numbered(t, e, 2)
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	branchtest.WaitFor(t, "the closed lineage removed after its retention", func() bool { return gone(e, sids...) })
	if u, err := e.Usage(); err != nil || u.Manifest.States != 0 || u.GC.States != int64(len(sids)) {
		t.Errorf("after the retention: %+v %v", u, err)
	}
}

// TestPinOutlivesRetention: a pinned state (and its ancestors) stays
// past its closed env's retention and still restores; the rest of the
// lineage goes; once unpinned it goes too.
func TestPinOutlivesRetention(t *testing.T) {
	r := retainRig(t, time.Second, nil)
	ctx := context.Background()
	e := r.e
	env, sids := numbered(t, e, 3)
	if err := e.Pin(sids[2]); err != nil {
		t.Fatal(err)
	}
	if err := e.Pin("s-nosuch"); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("pin of an unknown state: %v, want state.ErrUnknownState", err)
	}
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	// sids[3] descends from the pinned state: nothing keeps it.
	branchtest.WaitFor(t, "the unpinned tail removed after the retention", func() bool { return gone(e, sids[3]) })
	exists(t, e, "pinned state and its ancestors past the retention", sids[:3]...)
	branchCheck(t, e, sids[2], "2")
	if err := e.Unpin(sids[2]); err != nil {
		t.Fatal(err)
	}
	branchtest.WaitFor(t, "the unpinned state removed", func() bool { return gone(e, sids...) })
}

// TestReleaseOpenHead: releasing states an open env still needs (its head
// and its ancestors) is accepted and harmless: they stay branchable while
// the env is open, also after it moved on, and go at once (without the
// retention the env's other states get) when it closes.
func TestReleaseOpenHead(t *testing.T) {
	r := retainRig(t, time.Hour, nil)
	ctx := context.Background()
	e := r.e
	env, sids := numbered(t, e, 2)
	if err := e.Release(sids[1], sids[2]); err != nil {
		t.Fatalf("release of an open env's head and its parent: %v", err)
	}
	if err := e.Release(sids[1], "s-nosuch"); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("release naming an unknown state: %v, want state.ErrUnknownState", err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	exists(t, e, "released states of an open env's lineage", sids...)
	// The children's own states are retained (they closed): they would
	// keep their ancestors; they are released by name at the end.
	kids := []string{branchCheck(t, e, sids[2], "2"), branchCheck(t, e, sids[1], "1")}
	run(t, e, env, "echo 3 > /f")
	s3, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	exists(t, e, "released ancestors of an open env's head", sids...)
	kids = append(kids, branchCheck(t, e, sids[2], "2"))
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	// s3 and s0 are retained (an hour), s1 and s2 (released by name) are
	// not; but they are s3's ancestors, and the lineage of a kept state
	// is kept whole.
	exists(t, e, "the retained head's lineage", append(sids, s3)...)
	if err := e.Release(append(kids, s3)...); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	// Now only s0, retained, stays: s1..s3 were released by name.
	exists(t, e, "the retained first state", sids[0])
	if !gone(e, append(kids, sids[1], sids[2], s3)...) {
		t.Error("states released by name in a closed lineage survived GC")
	}
}

// TestPendingBranchKeepsState: a branch from a state id holds it: the
// env that made it closes (no retention) while the branch's restore is
// queued, GC runs, and the branch still gets its child.
func TestPendingBranchKeepsState(t *testing.T) {
	r := retainRig(t, 0, nil)
	ctx := context.Background()
	e := r.e
	env, sids := numbered(t, e, 1)
	sid := sids[1]
	release := branchtest.HoldQueue(t, e, "busybox")
	type answer struct {
		res *branch.BranchResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
		done <- answer{res, err}
	}()
	branchtest.WaitFor(t, "the branch's restore queued", func() bool {
		u, err := e.Usage()
		return err == nil && u.Queue.High.Queued > 0
	})
	if !branch.Held(e, sid) {
		t.Fatal("the queued branch does not hold its state")
	}
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	exists(t, e, "state of a pending branch", sid)
	release()
	a := <-done
	if a.err == nil {
		a.err = a.res.Errors[0]
	}
	if a.err != nil {
		t.Fatalf("branch whose source env closed while it was queued: %v", a.err)
	}
	child := a.res.Children[0]
	if got := strings.TrimSpace(run(t, e, child, "cat /f")); got != "1" {
		t.Errorf("child /f = %q, want 1", got)
	}
	// The child keeps the state (its head); once it closes, all goes.
	if err := e.CloseEnv(ctx, child); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if !gone(e, sids...) || branch.Held(e, sid) {
		t.Errorf("after the child closed: states left or still held")
	}
}

// TestGCKeepsOpenLineages: GC removes what nobody needs (states released
// by name after a rollback, the closed parent's tail no child descends
// from) and never a state an open env's lineage needs: every one of them
// still branches with the right contents after GC passes, the background
// ones included.
func TestGCKeepsOpenLineages(t *testing.T) {
	r := retainRig(t, 0, func(o *branch.Options) { o.GCBatch = 1 })
	ctx := context.Background()
	e := r.e
	a, sids := numbered(t, e, 3)
	// a rolls back to s1, abandoning s2 and s3, which it then releases.
	if err := e.Rollback(ctx, a, sids[1]); err != nil {
		t.Fatal(err)
	}
	run(t, e, a, "echo 4 > /f")
	s4, err := e.Checkpoint(ctx, a, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Release(sids[2], sids[3]); err != nil {
		t.Fatal(err)
	}
	res, err := e.Branch(ctx, branch.Source{Env: a}, 1)
	if err == nil {
		err = res.Errors[0]
	}
	if err != nil {
		t.Fatal(err)
	}
	b := res.Children[0]
	run(t, e, b, "echo 5 > /f")
	s5, err := e.Checkpoint(ctx, b, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	// a's sibling c, closed: its states go, as s2 and s3 do.
	c, csids := numbered(t, e, 2)
	if err := e.CloseEnv(ctx, c); err != nil {
		t.Fatal(err)
	}
	waitPasses(t, e, 3)
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if !gone(e, sids[2], sids[3]) || !gone(e, csids...) {
		t.Error("released states nobody needs survived GC")
	}
	for _, env := range []*branch.Env{a, b} {
		line, err := e.Lineage(env.Head())
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range line {
			want := map[string]string{sids[0]: "", sids[1]: "1", s4: "4", s5: "5"}[st.ID]
			branchCheck(t, e, st.ID, want)
		}
	}
	// a closes: b still needs s0, s1 and s4 (its lineage), and keeps them.
	if err := e.CloseEnv(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	exists(t, e, "lineage of an open branch child after its parent closed", sids[0], sids[1], s4, s5)
	branchCheck(t, e, s4, "4")
	branchCheck(t, e, sids[1], "1")
}

// TestGCWhileStepping: the background GC runs (small batches, short
// interval) while envs step, checkpoint, branch and close children; no
// operation fails, the GC deletes what the children leave, and every
// state of the open envs' lineages still restores with its contents.
func TestGCWhileStepping(t *testing.T) {
	r := retainRig(t, 0, func(o *branch.Options) {
		o.GCBatch = 2
		o.GCInterval = 20 * time.Millisecond
	})
	ctx := context.Background()
	e := r.e
	const envs, turns = 2, 6
	var wg sync.WaitGroup
	errs := make(chan error, 2*envs*turns)
	steppers := make([]*branch.Env, envs)
	for i := range steppers {
		env, _, err := e.NewEnv(ctx, "busybox")
		if err != nil {
			t.Fatal(err)
		}
		steppers[i] = env
	}
	for _, env := range steppers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for turn := 1; turn <= turns; turn++ {
				res, err := e.Exec(ctx, env, "echo "+strconv.Itoa(turn)+" > /f", execOpts())
				if err == nil && res.ExitCode != 0 {
					err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
				}
				if err == nil {
					_, _, err = e.CheckpointAsync(env, state.Full)
				}
				if err != nil {
					errs <- fmt.Errorf("env %s turn %d: %w", env.ID, turn, err)
					return
				}
				// A child of this turn's state makes a state of its own
				// and closes: garbage for the GC.
				br, err := e.Branch(ctx, branch.Source{Env: env}, 1)
				if err == nil {
					err = br.Errors[0]
				}
				if err != nil {
					errs <- fmt.Errorf("env %s turn %d: branch: %w", env.ID, turn, err)
					return
				}
				child := br.Children[0]
				if _, err := e.Exec(ctx, child, "echo child > /f", execOpts()); err != nil {
					errs <- err
				} else if _, err := e.Checkpoint(ctx, child, state.Full); err != nil {
					errs <- err
				}
				if err := e.CloseEnv(ctx, child); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	branchtest.WaitFor(t, "the GC to delete the children's states", func() bool {
		u, err := e.Usage()
		return err == nil && u.GC.States >= envs*turns
	})
	for _, env := range steppers {
		if _, err := e.WaitCheckpoint(ctx, env); err != nil {
			t.Fatal(err)
		}
		if err := env.TakeCheckpointError(); err != nil {
			t.Fatal(err)
		}
		line, err := e.Lineage(env.Head())
		if err != nil {
			t.Fatal(err)
		}
		if len(line) != turns+1 {
			t.Errorf("env %s: lineage of %d states, want %d", env.ID, len(line), turns+1)
		}
		for i, st := range line {
			want := ""
			if i > 0 {
				want = strconv.Itoa(i)
			}
			branchCheck(t, e, st.ID, want)
		}
	}
	u, err := e.Usage()
	if err != nil || u.GC.Errors != 0 {
		t.Errorf("GC: %+v %v", u.GC, err)
	}
	t.Logf("GC: %d passes, %d states and %d artifacts (%d bytes) deleted, longest pass %v",
		u.GC.Passes, u.GC.States, u.GC.Artifacts, u.GC.Bytes, u.GC.MaxPass)
}

// TestGCBatches: a pass deletes at most GCBatch states; a closed lineage
// longer than that is collected in several passes, back to back, by the
// background GC alone.
func TestGCBatches(t *testing.T) {
	const batch, n = 4, 20
	r := retainRig(t, 0, func(o *branch.Options) { o.GCBatch = batch })
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		run(t, e, env, "echo "+strconv.Itoa(i)+" > /f")
		if _, err := e.Checkpoint(ctx, env, state.FS); err != nil {
			t.Fatal(err)
		}
	}
	before, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	branchtest.WaitFor(t, "the closed lineage collected", func() bool {
		u, err := e.Usage()
		return err == nil && u.Manifest.States == 0
	})
	// The last pass counts itself as it ends, after its deletions are
	// visible: wait for it (a pass or two more only raise the count,
	// which stays under the bound if one pass took more than a batch).
	waitPasses(t, e, 1)
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	deleted, passes := u.GC.States-before.GC.States, u.GC.Passes-before.GC.Passes
	if deleted != n+1 || passes < (n+1+batch-1)/batch {
		t.Errorf("%d states deleted in %d passes, want %d in at least %d (batches of %d)", deleted, passes, n+1, (n+1+batch-1)/batch, batch)
	}
	t.Logf("GC: %d states in %d passes, longest pass %v", deleted, passes, u.GC.MaxPass)
}

// TestGCKeepsUndeletedArtifact: an artifact whose files cannot be deleted
// (the snapshots' directory made append-only: btrfs refuses with EPERM)
// keeps its record, the pass counts an error, and a later pass deletes it
// once it can; no snapshot is left that the manifest does not know.
func TestGCKeepsUndeletedArtifact(t *testing.T) {
	r := retainRig(t, 0, nil)
	ctx := context.Background()
	e := r.e
	env, sids := numbered(t, e, 1)
	dir := r.snap.Path(strings.TrimSuffix(branch.SnapshotPrefix, "/"))
	chattr := func(flag string) {
		t.Helper()
		if out, err := exec.Command("chattr", flag, dir).CombinedOutput(); err != nil {
			t.Fatalf("chattr %s %s: %v: %s", flag, dir, err, out)
		}
	}
	chattr("+a")
	appendOnly := true
	defer func() {
		if appendOnly {
			exec.Command("chattr", "-a", dir).Run()
		}
	}()
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err == nil {
		t.Fatal("GC reported no failure while the snapshots could not be deleted")
	} else {
		t.Logf("GC: %v", err)
	}
	if !gone(e, sids...) {
		t.Error("the states were not forgotten")
	}
	vols, _ := r.snap.List(ctx, branch.SnapshotPrefix)
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if n := u.Manifest.Artifacts[manifest.ArtifactFS].Count; n != len(sids) || len(vols) != len(sids) || u.GC.Errors == 0 {
		t.Errorf("after the failed deletions: %d fs records, snapshots %v, GC %+v; want the %d records and snapshots kept and the errors counted",
			n, vols, u.GC, len(sids))
	}
	chattr("-a")
	appendOnly = false
	if err := e.GC(ctx); err != nil {
		t.Fatalf("GC once the snapshots can go: %v", err)
	}
	if vols, _ := r.snap.List(ctx, branch.SnapshotPrefix); len(vols) != 0 {
		t.Errorf("snapshots left: %v", vols)
	}
	if u, _ := e.Usage(); u.Manifest.Artifacts[manifest.ArtifactFS].Count != 0 {
		t.Errorf("fs artifacts left: %+v", u.Manifest.Artifacts)
	}
}
