package branch_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/state"
)

func usage(t *testing.T, e *branch.Engine) branch.Usage {
	t.Helper()
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// lowJobs counts the background jobs the queue has seen: queued,
// finished, and running (when no high-priority job runs, the running
// ones are background ones).
func lowJobs(u branch.Usage) uint64 {
	q := u.Queue
	return uint64(q.Low.Queued) + q.Low.Completed + q.Low.Cancelled + uint64(q.Running)
}

// waitUsage polls e's usage until ok holds (the background GC expires
// prepared copies), failing the test after a minute.
func waitUsage(t *testing.T, e *branch.Engine, what string, ok func(branch.Usage) bool) branch.Usage {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		u := usage(t, e)
		if ok(u) {
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened; usage: warm %d, prepare %+v", what, u.Warm, u.Prepare)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPreparePastState prepares copies of a past state (not an env's
// head), branches from it and checks that the children are the thawed
// copies (no restore ran for them, none was queued to replace them) and
// hold that state's files; that the budget refuses what does not fit;
// that prepared copies keep their state from GC after its env closed and
// survive the close of a child whose head that state was; and that the
// TTL destroys what is left, after which GC collects the state.
func TestPreparePastState(t *testing.T) {
	r := retainRig(t, 0, func(o *branch.Options) {
		o.PrepareTTL = time.Hour // expired by moving the engine's clock
		o.PrepareCopies = 3
	})
	e := r.e
	ctx := context.Background()
	env, sids := numbered(t, e, 2) // sids[1]: /f = 1; sids[2], the head: /f = 2
	past := sids[1]

	if _, err := e.Prepare(ctx, []string{"no-such-state"}, 1, false); !errors.Is(err, state.ErrUnknownState) {
		t.Fatalf("prepare of an unknown state: %v, want state.ErrUnknownState", err)
	}
	res, err := e.Prepare(ctx, []string{past}, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Prepared[past] != 2 || res.Ready[past] != 2 || res.Refused != nil {
		t.Fatalf("prepare(%s, 2, wait): %+v, want 2 prepared, 2 ready, none refused", past, res)
	}
	if u := usage(t, e); u.Warm != 2 || u.Prepare.Ready != 2 || u.Prepare.Queued != 0 {
		t.Fatalf("after prepare: warm %d, prepare %+v; want 2 ready copies", u.Warm, u.Prepare)
	}
	// Again: it has them already, nothing more is queued (nor charged).
	if res, err := e.Prepare(ctx, []string{past}, 2, false); err != nil || res.Prepared[past] != 2 || res.Refused != nil {
		t.Fatalf("prepare again: %+v, %v", res, err)
	}

	// Budget 3: one of the head's two fits, the other is refused; then
	// nothing fits at all.
	head := sids[2]
	res, err = e.Prepare(ctx, []string{head}, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Prepared[head] != 1 || res.Ready[head] != 1 || res.Refused[head] != 1 {
		t.Fatalf("prepare over the budget: %+v, want 1 prepared and ready, 1 refused", res)
	}
	res, err = e.Prepare(ctx, []string{sids[0]}, 1, false)
	if !errors.Is(err, state.ErrOverBudget) || res.Refused[sids[0]] != 1 {
		t.Fatalf("prepare with the budget used up: %+v, %v; want state.ErrOverBudget, 1 refused", res, err)
	}
	if u := usage(t, e); u.Prepare.Refused != 2 || u.Prepare.Ready != 3 {
		t.Fatalf("prepare stats %+v, want 3 ready and 2 refused", u.Prepare)
	}

	// The env closes and its states are released at once (retain 0):
	// only the prepared copies keep past and head.
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	for _, sid := range []string{past, head} {
		if _, err := e.State(sid); err != nil {
			t.Fatalf("state %s with prepared copies after its env closed and GC ran: %v", sid, err)
		}
	}

	branchPrepared := func(i int) {
		t.Helper()
		before := usage(t, e)
		res, err := e.Branch(ctx, branch.Source{State: past}, 1)
		if err == nil {
			err = res.Errors[0]
		}
		if err != nil {
			t.Fatalf("branch %d from the prepared state: %v", i, err)
		}
		after := usage(t, e)
		if n := after.Queue.High.Completed - before.Queue.High.Completed; n != 0 {
			t.Errorf("branch %d from a prepared state ran %d restores, want 0 (it thaws a prepared copy)", i, n)
		}
		if n := after.Prepare.Taken - before.Prepare.Taken; n != 1 {
			t.Errorf("branch %d took %d prepared copies, want 1", i, n)
		}
		if lowJobs(after) != lowJobs(before) {
			t.Errorf("branch %d queued background work (%d -> %d jobs): a taken prepared copy must not be refilled",
				i, lowJobs(before), lowJobs(after))
		}
		child := res.Children[0]
		if got := strings.TrimSpace(run(t, e, child, "cat /f")); got != "1" {
			t.Errorf("child %d of the prepared state: /f = %q, want 1", i, got)
		}
		// The child's head is past: its close must not drop past's other
		// prepared copy (only a head's own warm copies go).
		if err := e.CloseEnv(ctx, child); err != nil {
			t.Fatal(err)
		}
	}
	branchPrepared(0)
	if u := usage(t, e); u.Prepare.Ready != 2 || u.Warm != 2 {
		t.Fatalf("after one branch and its child's close: warm %d, prepare %+v; want 2 ready (1 of past, 1 of head)", u.Warm, u.Prepare)
	}
	branchPrepared(1)
	if u := usage(t, e); u.Prepare.Ready != 1 || u.Prepare.Taken != 2 {
		t.Fatalf("after two branches: prepare %+v; want 1 ready (head's), 2 taken", u.Prepare)
	}

	// The TTL passes: the head's unused copy is destroyed, then GC takes
	// the state it kept.
	branch.AdvanceClock(e, 2*time.Hour)
	u := waitUsage(t, e, "prepared copy expired", func(u branch.Usage) bool { return u.Prepare.Expired == 1 })
	if u.Warm != 0 || u.Prepare.Ready != 0 {
		t.Fatalf("after the TTL: warm %d, prepare %+v; want no copies", u.Warm, u.Prepare)
	}
	// Its sandbox is gone with it: no env is open, no root is left.
	if vols := sandboxVolumes(t, r); len(vols) != 0 {
		t.Errorf("after the TTL, with no env open, sandbox roots are left: %v", vols)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.State(head); !errors.Is(err, state.ErrUnknownState) {
		t.Fatalf("state %s after its prepared copies expired and GC ran: %v, want state.ErrUnknownState", head, err)
	}
	// A collected state can no longer be prepared.
	if _, err := e.Prepare(ctx, []string{head}, 1, false); !errors.Is(err, state.ErrUnknownState) {
		t.Fatalf("prepare of a collected state: %v, want state.ErrUnknownState", err)
	}
}

func sandboxVolumes(t *testing.T, r *rig) []string {
	t.Helper()
	vols, err := r.snap.List(context.Background(), launch.VolumePrefix)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range vols {
		if strings.HasPrefix(v.Name, launch.VolumePrefix) {
			out = append(out, v.Name)
		}
	}
	return out
}

// TestPrepareHeadWithWarmCopies prepares copies of an env's head that
// also has a warm copy (Options.WarmCopies): a branch takes the prepared
// ones first and replaces none of them; a branch that then takes the
// head's own copy has it replaced, as without prepare. Without wait, the
// copies become ready in the background. Close destroys what is left.
func TestPrepareHeadWithWarmCopies(t *testing.T) {
	r := retainRig(t, 0, func(o *branch.Options) { o.WarmCopies = 1 })
	e := r.e
	ctx := context.Background()
	_, sids := numbered(t, e, 1)
	head := sids[1]
	waitWarm(t, e, 1)
	res, err := e.Prepare(ctx, []string{head}, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Prepared[head] != 2 {
		t.Fatalf("prepare(head, 2): %+v, want 2 prepared", res)
	}
	u := waitUsage(t, e, "prepared copies ready", func(u branch.Usage) bool { return u.Prepare.Ready == 2 })
	if u.Warm != 3 || u.Prepare.Queued != 0 {
		t.Fatalf("warm %d, prepare %+v; want 3 copies (1 warm, 2 prepared)", u.Warm, u.Prepare)
	}
	branchN := func(n int) (before, after branch.Usage) {
		t.Helper()
		before = usage(t, e)
		res, err := e.Branch(ctx, branch.Source{State: head}, n)
		if err != nil {
			t.Fatal(err)
		}
		after = usage(t, e)
		for i, c := range res.Children {
			if res.Errors[i] != nil {
				t.Fatalf("child %d: %v", i, res.Errors[i])
			}
			if got := strings.TrimSpace(run(t, e, c, "cat /f")); got != "1" {
				t.Errorf("child %d: /f = %q, want 1", i, got)
			}
		}
		if n := after.Queue.High.Completed - before.Queue.High.Completed; n != 0 {
			t.Errorf("branch(%d) with %d copies ran %d restores, want 0", len(res.Children), before.Warm, n)
		}
		return before, after
	}
	before, after := branchN(2)
	if n := after.Prepare.Taken - before.Prepare.Taken; n != 2 {
		t.Errorf("branch(2) took %d prepared copies, want 2 (prepared ones first)", n)
	}
	if lowJobs(after) != lowJobs(before) {
		t.Errorf("branch(2) of prepared copies queued background work (%d -> %d jobs), want none", lowJobs(before), lowJobs(after))
	}
	before, after = branchN(1)
	if n := after.Prepare.Taken - before.Prepare.Taken; n != 0 {
		t.Errorf("branch(1) took %d prepared copies, want 0 (none left)", n)
	}
	if d := lowJobs(after) - lowJobs(before); d != 1 {
		t.Errorf("branch(1) of the head's warm copy queued %d background jobs, want 1 (its replacement)", d)
	}
	waitWarm(t, e, 1)
	if _, err := e.Prepare(ctx, []string{head}, 1, true); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if vols := sandboxVolumes(t, r); len(vols) != 0 {
		t.Errorf("after Close, sandbox roots are left: %v", vols)
	}
}

// TestPrepareExpiresInFlight lets the TTL of a state's prepared copies
// pass while their restores are still queued or running (one worker,
// four copies): every copy, ready at the expiry or restored after it, is
// destroyed and counted expired, and none is kept.
func TestPrepareExpiresInFlight(t *testing.T) {
	r := retainRig(t, 0, func(o *branch.Options) {
		o.PrepareTTL = time.Hour
		o.Workers = 1 // the restores run one after another
	})
	e := r.e
	ctx := context.Background()
	_, sids := numbered(t, e, 1)
	if _, err := e.Prepare(ctx, []string{sids[0]}, 4, false); err != nil {
		t.Fatal(err)
	}
	branch.AdvanceClock(e, 2*time.Hour)
	u := waitUsage(t, e, "4 copies expired", func(u branch.Usage) bool { return u.Prepare.Expired == 4 })
	if u.Warm != 0 || u.Prepare.Queued != 0 || u.Prepare.Ready != 0 {
		t.Errorf("after the TTL: warm %d, prepare %+v; want no copies", u.Warm, u.Prepare)
	}
	// Only the env's own root is left.
	if vols := sandboxVolumes(t, r); len(vols) != 1 {
		t.Errorf("sandbox roots left: %v, want only the env's", vols)
	}
}

// TestPrepareExpiredBeforeItsTurn: prepared copies whose TTL passes while
// their restores still wait in the queue (its one worker held) are not
// restored at all once their turn comes, and count as expired; a prepare
// of the same state after the TTL is within the budget again.
func TestPrepareExpiredBeforeItsTurn(t *testing.T) {
	r := retainRig(t, 0, func(o *branch.Options) {
		o.PrepareTTL = time.Hour
		o.PrepareCopies = 4
		o.Workers = 1
	})
	e := r.e
	ctx := context.Background()
	_, sids := numbered(t, e, 1)
	release := branch.HoldQueue(e)
	before := usage(t, e)
	if _, err := e.Prepare(ctx, []string{sids[0]}, 4, false); err != nil {
		release()
		t.Fatal(err)
	}
	branch.AdvanceClock(e, 2*time.Hour)
	release()
	u := waitUsage(t, e, "4 copies expired", func(u branch.Usage) bool { return u.Prepare.Expired == 4 })
	if n := u.Coord.Restores - before.Coord.Restores; n != 0 {
		t.Errorf("%d restores of copies that expired before their turn, want 0", n)
	}
	if u.Warm != 0 || u.Prepare.Queued != 0 || u.Prepare.Ready != 0 {
		t.Errorf("after the TTL: warm %d, prepare %+v; want no copies", u.Warm, u.Prepare)
	}
	res, err := e.Prepare(ctx, []string{sids[0]}, 4, true)
	if err != nil || res.Ready[sids[0]] != 4 {
		t.Fatalf("prepare after the expiry: %+v %v, want 4 ready", res, err)
	}
}

// TestPrepareUnderDiskPressure: once a watched file system is over its
// high mark the GC drops every prepared copy (they are for speed only,
// and hold their states and clones) before it evicts anything, and
// prepare answers state.ErrNoSpace until the pool is back under its low mark.
func TestPrepareUnderDiskPressure(t *testing.T) {
	r := retainRig(t, time.Hour, func(o *branch.Options) {
		o.GCInterval = 50 * time.Millisecond
		o.PrepareTTL = time.Hour // no copy expires by itself here
	})
	e := r.e
	ctx := context.Background()
	_, sids := numbered(t, e, 2)
	res, err := e.Prepare(ctx, []string{sids[0]}, 2, true)
	if err != nil || res.Ready[sids[0]] != 2 {
		t.Fatalf("prepare: %+v %v, want 2 ready", res, err)
	}
	var full atomic.Bool
	const total = 1 << 30
	branch.SetStatfs(e, func(name, _ string) (int64, int64, int64, error) {
		used := int64(total / 2)
		if name == branch.DiskPool && full.Load() {
			used = total / 100 * 95
		}
		return used, total, total - used, nil
	})
	full.Store(true)
	u := waitUsage(t, e, "the prepared copies dropped under pressure", func(u branch.Usage) bool {
		return u.Prepare.Ready == 0 && u.Prepare.Expired == 2
	})
	if u.Warm != 0 {
		t.Errorf("warm copies under pressure: %d, want 0", u.Warm)
	}
	exists(t, e, "the open env's states under pressure", sids...)
	if _, err := e.Prepare(ctx, []string{sids[0]}, 1, false); !errors.Is(err, state.ErrNoSpace) {
		t.Errorf("prepare under pressure: %v, want state.ErrNoSpace", err)
	}
	full.Store(false)
	waitUsage(t, e, "the pool back under its low mark", func(u branch.Usage) bool {
		for _, d := range u.Disk {
			if d.Over {
				return false
			}
		}
		return true
	})
	if res, err := e.Prepare(ctx, []string{sids[0]}, 1, true); err != nil || res.Ready[sids[0]] != 1 {
		t.Errorf("prepare after the pressure: %+v %v, want 1 ready", res, err)
	}
}
