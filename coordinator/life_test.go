package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

func sandboxOpts() sandbox.ExecOptions { return sandbox.ExecOptions{Timeout: 10 * time.Second} }

// TestBranchChildren: children of an env inherit its task, seed and turn
// count and have it as origin; children of a task's post-setup state get
// that task and no origin (the template is not handed out); promote and
// discard end children; a reset env has nothing to promote into.
func TestBranchChildren(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Task: "count", Seed: 7})
	parent := r.Env.ID
	bash(t, c, parent, "echo 1 > /work/n")
	res, err := c.Branch(ctx, BranchRequest{EnvID: parent, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i, ch := range res.Children {
		if ch == nil {
			t.Fatal(res.Errors[i])
		}
		if ch.Origin != parent {
			t.Errorf("child %s origin %q, want %s", ch.ID, ch.Origin, parent)
		}
		if tk, ok := c.Task(ch.ID); !ok || tk.Name != "count" {
			t.Errorf("child %s task %+v %v", ch.ID, tk, ok)
		}
	}
	keep, drop := res.Children[0].ID, res.Children[1].ID
	// The child's turn count goes on from the parent's episode, and the
	// episode's seed reaches its verifier.
	if tr := bash(t, c, keep, "echo 3 > /work/n"); tr.Turn != 2 {
		t.Errorf("child's first turn is turn %d, want 2", tr.Turn)
	}
	ev, err := c.Evaluate(ctx, keep, false)
	if err != nil || ev.Reward != 1 {
		t.Errorf("evaluate child: %+v %v", ev, err)
	}
	if tail, _ := ev.Details["stderr_tail"].(string); tail != "seed=7\n" {
		t.Errorf("verifier of the child saw %q, want the episode's seed 7", tail)
	}

	// A child of the task's post-setup state (made by the pool's
	// template, which is not handed out).
	post := pool.Stats().Tasks[0].State
	byState, err := c.Branch(ctx, BranchRequest{StateID: post, N: 1})
	if err != nil || byState.Children[0] == nil {
		t.Fatal(err, byState.Errors)
	}
	orphan := byState.Children[0]
	if orphan.Origin != "" {
		t.Errorf("child of the post-setup state has origin %q (a pool template)", orphan.Origin)
	}
	if tk, ok := c.Task(orphan.ID); !ok || tk.Name != "count" {
		t.Errorf("child of the post-setup state: task %+v %v, want count", tk, ok)
	}
	if _, _, err := c.Promote(ctx, orphan.ID); !errors.Is(err, state.ErrInvalid) {
		t.Errorf("promote of a child without origin: %v", err)
	}
	if err := c.Discard(ctx, orphan.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Discard(ctx, drop); err != nil {
		t.Fatal(err)
	}
	origin, sid, err := c.Promote(ctx, keep)
	if err != nil {
		t.Fatal(err)
	}
	if origin != parent || r.Env.Head() != sid {
		t.Errorf("promote: origin %s state %s, parent head %s", origin, sid, r.Env.Head())
	}
	for _, id := range []string{keep, drop, orphan.ID} {
		if c.Has(id) {
			t.Errorf("env %s still registered after promote/discard", id)
		}
		if _, err := engine.Env(id); !errors.Is(err, state.ErrUnknownEnv) {
			t.Errorf("env %s still open in the engine: %v", id, err)
		}
	}
	if got := bash(t, c, parent, "cat /work/n").Result.Stdout; string(got) != "3\n" {
		t.Errorf("parent after promote: n = %q, want 3", got)
	}
	if _, _, err := c.Promote(ctx, parent); !errors.Is(err, state.ErrInvalid) {
		t.Errorf("promote of a reset env: %v", err)
	}
}

// TestInternalEnvsInvisible: the pool's template and warm copies are
// engine envs, but the coordinator never handed them out: it neither
// lists nor accepts them, and they take no ticket.
func TestInternalEnvsInvisible(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	ctx := context.Background()
	if err := pool.WaitWarm(ctx); err != nil {
		t.Fatal(err)
	}
	r := reset(t, c, ResetRequest{Task: "count"})
	listed := map[string]bool{}
	for _, e := range c.Envs(context.Background()) {
		listed[e.Env.ID] = true
	}
	if len(listed) != 1 || !listed[r.Env.ID] {
		t.Errorf("Envs lists %v, want only %s", listed, r.Env.ID)
	}
	hidden := 0
	for _, env := range engine.Envs() {
		if env.ID == r.Env.ID {
			continue
		}
		hidden++
		if _, err := c.Turn(ctx, env.ID, Action{Tool: "bash", Cmd: "true"}); !errors.Is(err, state.ErrUnknownEnv) {
			t.Errorf("turn on the pool's env %s: %v, want state.ErrUnknownEnv", env.ID, err)
		}
		if _, err := c.Branch(ctx, BranchRequest{EnvID: env.ID, N: 1}); !errors.Is(err, state.ErrUnknownEnv) {
			t.Errorf("branch of the pool's env %s: %v, want state.ErrUnknownEnv", env.ID, err)
		}
		if _, _, err := c.Promote(ctx, env.ID); !errors.Is(err, state.ErrUnknownEnv) {
			t.Errorf("promote of the pool's env %s: %v, want state.ErrUnknownEnv", env.ID, err)
		}
		if _, err := c.Evaluate(ctx, env.ID, false); !errors.Is(err, state.ErrUnknownEnv) {
			t.Errorf("evaluate of the pool's env %s: %v, want state.ErrUnknownEnv", env.ID, err)
		}
		if err := c.Discard(ctx, env.ID); !errors.Is(err, state.ErrUnknownEnv) {
			t.Errorf("discard of the pool's env %s: %v, want state.ErrUnknownEnv", env.ID, err)
		}
		if _, err := engine.Env(env.ID); err != nil {
			t.Errorf("the pool's env %s is gone after the coordinator refused to touch it: %v", env.ID, err)
		}
		if c.Has(env.ID) {
			t.Errorf("pool env %s is registered", env.ID)
		}
		if tk := c.take(env.ID); !tk.ready() || len(tk.nexts) != 0 {
			t.Errorf("ticket of the pool's env %s queues", env.ID)
		}
	}
	if hidden == 0 {
		t.Error("the engine has no env besides the reset one: no template or warm copy to check")
	}
}

// TestIdleTTL: the janitor closes an env nobody used for IdleTTL and
// forgets it; an env in use stays. sweep is called with a chosen clock so
// the test does not depend on timing; the janitor itself is checked to
// run by one real expiry.
func TestIdleTTL(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full, IdleTTL: time.Hour})
	idle := reset(t, c, ResetRequest{Image: "busybox"}).Env
	used := reset(t, c, ResetRequest{Image: "busybox"}).Env
	later := time.Now().Add(90 * time.Minute)
	c.mu.Lock()
	c.envs[used.ID].used.Store(later.Add(-time.Minute).UnixNano())
	c.mu.Unlock()
	c.sweep(later)
	if c.Has(idle.ID) {
		t.Error("idle env still registered")
	}
	if _, err := engine.Env(idle.ID); !errors.Is(err, state.ErrUnknownEnv) {
		t.Errorf("idle env still open: %v", err)
	}
	if !c.Has(used.ID) {
		t.Error("env used a minute ago was closed")
	}
	if _, err := c.Turn(context.Background(), idle.ID, Action{Tool: "bash", Cmd: "true"}); !errors.Is(err, state.ErrUnknownEnv) {
		t.Errorf("turn on the closed env: %v", err)
	}

	// An operation that runs longer than the TTL (a long command) holds
	// the env's ticket while the janitor finds the env idle: the close
	// waits for it, and the env, used until the operation ended, stays.
	long := reset(t, c, ResetRequest{Image: "busybox"}).Env
	wait, release := c.Ticket(long.ID)
	wait()
	found := c.idleAt(later)
	if _, ok := found[long.ID]; !ok {
		t.Fatalf("env %s not idle at %v: the test needs it found idle while its ticket is held", long.ID, later)
	}
	swept := make(chan struct{})
	go func() { c.closeIdle(found); close(swept) }()
	release() // the long operation ends
	<-swept
	if !c.Has(long.ID) {
		t.Error("an env whose operation ran while the janitor found it idle was closed when the operation ended")
	}

	// The janitor runs on its own.
	c2 := newCoordinator(t, Options{Classify: Full, IdleTTL: 100 * time.Millisecond})
	env := reset(t, c2, ResetRequest{Image: "busybox"}).Env
	deadline := time.Now().Add(30 * time.Second)
	for c2.Has(env.ID) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if c2.Has(env.ID) {
		t.Error("the janitor did not close an env idle for 100 ms within 30 s")
	}
}

// TestLimitsAndErrors: MaxEnvs bounds resets and branches; an unknown
// image and an unknown task are the client's mistakes.
func TestLimitsAndErrors(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full, MaxEnvs: 2})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	if _, err := c.Branch(ctx, BranchRequest{EnvID: r.Env.ID, N: 2}); !errors.Is(err, state.ErrTooManyEnvs) {
		t.Errorf("branch past MaxEnvs: %v", err)
	}
	// More children than MaxEnvs can never be made: out of range.
	if _, err := c.Branch(ctx, BranchRequest{EnvID: r.Env.ID, N: 3}); !errors.Is(err, state.ErrInvalidParams) {
		t.Errorf("branch of more than MaxEnvs children: %v, want state.ErrInvalidParams", err)
	}
	if _, err := c.Reset(ctx, ResetRequest{Task: "nope"}); protocol.ErrorOf(err).Code != "unknown_task" {
		t.Errorf("unknown task: %v", err)
	}
	_, err := c.Reset(ctx, ResetRequest{Image: "nope"})
	if pe := protocol.ErrorOf(err); pe == nil || pe.Code != "bad_request" || pe.Infra {
		t.Errorf("unknown image: %v (%+v), want bad_request, not infra", err, pe)
	}
	if _, err := c.Reset(ctx, ResetRequest{}); !errors.Is(err, state.ErrInvalidParams) {
		t.Errorf("reset of nothing: %v", err)
	}
}

// TestReleasedState: a restore that failed because its state was released
// meanwhile (a concurrent close) is the client's unknown_state, not an
// infra restore_failed; a restore failure of a state that still exists
// stays restore_failed. (The engine now holds a pending branch's state,
// so TestBranchOfReleasedState's race ends with a child; released stays
// the fallback this pins.)
func TestReleasedState(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	s1 := bash(t, c, r.Env.ID, "echo 1 > /tmp/f").StateID
	if _, err := c.Checkpoint(ctx, r.Env.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseEnv(ctx, r.Env.ID); err != nil {
		t.Fatal(err)
	}
	if err := engine.GC(ctx); err != nil { // the engine keeps no retention here
		t.Fatal(err)
	}
	if _, err := engine.State(s1); !errors.Is(err, state.ErrUnknownState) {
		t.Fatalf("state %s of a closed env is still there (%v): the test needs it released", s1, err)
	}
	restoreErr := fmt.Errorf("%w: get state %s: not found", state.ErrRestore, s1)
	if pe := protocol.ErrorOf(c.released(s1, restoreErr)); pe.Code != "unknown_state" || pe.Infra || pe.Retryable {
		t.Errorf("restore of a released state: %+v, want unknown_state, not infra", pe)
	}
	if pe := protocol.ErrorOf(c.released("", restoreErr)); pe.Code != "restore_failed" {
		t.Errorf("restore failure of an env's current state (no state id): %+v, want restore_failed", pe)
	}
	live := pool.Stats().Tasks[0].State
	if pe := protocol.ErrorOf(c.released(live, fmt.Errorf("%w: criu said no", state.ErrRestore))); pe.Code != "restore_failed" || !pe.Infra {
		t.Errorf("restore failure of a live state: %+v, want restore_failed, infra", pe)
	}
}

// TestBranchOfReleasedState: a branch from a state id whose env is closed
// (with no retention) while the branch's restore waits in the queue (held,
// so the close and a GC come first for sure) still gets its child: the
// pending branch holds its state (docs/engine.md, "Retention").
func TestBranchOfReleasedState(t *testing.T) {
	c, e := ownCoordinator(t, Options{Classify: Full})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	s1 := bash(t, c, r.Env.ID, "echo 1 > /tmp/f").StateID
	if err := c.WaitTurn(ctx, r.Env.ID); err != nil {
		t.Fatal(err)
	}
	release := branchtest.HoldQueue(t, e, "busybox")
	type answer struct {
		res *BranchResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := c.Branch(ctx, BranchRequest{StateID: s1, N: 1})
		done <- answer{res, err}
	}()
	// The branch's restore is queued behind the held workers.
	branchtest.WaitFor(t, "the branch's restore queued", func() bool {
		u, err := e.Usage()
		return err == nil && u.Queue.High.Queued > 0
	})
	if err := c.CloseEnv(ctx, r.Env.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.State(s1); err != nil {
		t.Fatalf("state %s of a pending branch after its env closed and GC ran: %v", s1, err)
	}
	release()
	a := <-done
	if a.err != nil {
		t.Fatalf("branch of a state whose env closed under it: %v", a.err)
	}
	child := a.res.Children[0]
	if got := bash(t, c, child.ID, "cat /tmp/f").Result.Stdout; strings.TrimSpace(string(got)) != "1" {
		t.Errorf("child /tmp/f = %q, want 1", got)
	}
	if err := c.CloseEnv(ctx, child.ID); err != nil {
		t.Fatal(err)
	}
}

// TestPinAndRelease: a state id a step just returned can be pinned at
// once (its checkpoint is waited for); the pin keeps it through its env's
// close and GC, also when it is released; unpinned, it goes. Unknown ids
// are unknown_state and change nothing; no ids is invalid_params.
func TestPinAndRelease(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	s1 := bash(t, c, r.Env.ID, "echo 1 > /tmp/f").StateID
	if err := c.Pin(ctx, []string{s1}); err != nil {
		t.Fatalf("pin of the state a step just returned: %v", err)
	}
	for name, f := range map[string]func(context.Context, []string) error{"pin": c.Pin, "unpin": c.Unpin, "release": c.Release} {
		if pe := protocol.ErrorOf(f(ctx, []string{s1, "s-nosuch"})); pe == nil || pe.Code != protocol.CodeUnknownState {
			t.Errorf("%s naming an unknown state: %+v, want unknown_state", name, pe)
		}
		if pe := protocol.ErrorOf(f(ctx, nil)); pe == nil || pe.Code != protocol.CodeInvalidParams {
			t.Errorf("%s of no states: %+v, want invalid_params", name, pe)
		}
	}
	if err := c.CloseEnv(ctx, r.Env.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, []string{s1}); err != nil {
		t.Fatal(err)
	}
	if err := engine.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.State(s1); err != nil {
		t.Fatalf("pinned state after its env closed, its release and GC: %v", err)
	}
	if err := c.Unpin(ctx, []string{s1}); err != nil {
		t.Fatal(err)
	}
	if err := engine.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.State(s1); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("unpinned state of a closed env after GC: %v, want unknown", err)
	}
}

// TestLabels: an env handed out carries what a restarted coordinator
// needs to adopt it (task, seed, base turn); an ephemeral one (an MCP
// session's) carries none, so a restart closes it.
func TestLabels(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	r := reset(t, c, ResetRequest{Task: "count", Seed: 5})
	task, base, seed := fromLabels(r.Env.Labels())
	if r.Env.Labels()[labelServed] != "1" || task != r.Task || seed != 5 || base != r.Env.Turn() {
		t.Errorf("labels %v read back as task %+v base %d seed %d; want %+v, %d, 5", r.Env.Labels(), task, base, seed, r.Task, r.Env.Turn())
	}
	eph := reset(t, c, ResetRequest{Image: "busybox", Ephemeral: true})
	if l := eph.Env.Labels(); l[labelServed] != "" {
		t.Errorf("ephemeral env labelled %v", l)
	}
	// A protocol client's children of an ephemeral env (an MCP session's)
	// are its own, served envs: labelled, by env and by state id alike.
	ctx := context.Background()
	for _, req := range []BranchRequest{{EnvID: eph.Env.ID, N: 1}, {StateID: eph.StateID, N: 1}} {
		res, err := c.Branch(ctx, req)
		if err != nil || res.Children[0] == nil {
			t.Fatal(err, res)
		}
		if l := res.Children[0].Labels(); l[labelServed] != "1" {
			t.Errorf("child (%+v) of an ephemeral env labelled %v, want served", req, l)
		}
	}
	res, err := c.Branch(ctx, BranchRequest{EnvID: eph.Env.ID, N: 1, Ephemeral: true})
	if err != nil || res.Children[0] == nil {
		t.Fatal(err, res)
	}
	if l := res.Children[0].Labels(); l[labelServed] != "" {
		t.Errorf("ephemeral child labelled %v", l)
	}
}

// TestTicketOrder: operations on one env run one at a time in the order
// their tickets were taken, whoever takes them (server, agent, proxy,
// janitor); a ticket naming two envs waits for each; tickets of other
// envs do not wait. Whether a ticket may run is read without waiting
// (ready), so every check is exact.
func TestTicketOrder(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	a := reset(t, c, ResetRequest{Image: "busybox"}).Env.ID
	b := reset(t, c, ResetRequest{Image: "busybox"}).Env.ID
	other := reset(t, c, ResetRequest{Image: "busybox"}).Env.ID
	b0 := c.take(b)
	t1 := c.take(a)
	t2 := c.take(a)
	t3 := c.take(a, b)
	tb := c.take(b)
	check := func(when string, want map[string]bool) {
		t.Helper()
		for name, tk := range map[string]*ticket{"b0": b0, "1": t1, "2": t2, "3": t3, "b": tb} {
			if w, ok := want[name]; ok && tk.ready() != w {
				t.Errorf("%s: ticket %s ready %v, want %v", when, name, !w, w)
			}
		}
	}
	check("at first", map[string]bool{"b0": true, "1": true, "2": false, "3": false, "b": false})
	if o := c.take(other); !o.ready() {
		t.Error("a ticket of another env waits for a's and b's")
	} else {
		o.release()
	}
	t1.release()
	check("after 1", map[string]bool{"2": true, "3": false, "b": false})
	t2.release()
	// Ticket 3 still waits for b's first ticket.
	check("after 2", map[string]bool{"3": false, "b": false})
	b0.release()
	check("after b0", map[string]bool{"3": true, "b": false})
	t3.release()
	check("after 3", map[string]bool{"b": true})
	tb.release()
	// The public pair is the same ticket.
	wait, release := c.Ticket(a, b)
	if tk := c.take(a); tk.ready() {
		t.Error("a ticket taken after Ticket(a, b) is ready before it was released")
	} else {
		wait() // ready: nothing held before it
		release()
		if !tk.ready() {
			t.Error("releasing Ticket(a, b) did not let the next ticket of a run")
		}
		tk.release()
	}
	// Ids not handed out take no ticket.
	if tk := c.take("e-nope"); !tk.ready() || len(tk.nexts) != 0 {
		t.Error("a ticket of an id not handed out queues")
	}
}

// TestTenantLabels: an env's tenant is in its labels, served or
// ephemeral, so that a restart adopts it as its tenant's (recover.go) and
// its states stay its tenant's after it closed; a child inherits its
// source's tenant whoever branches it.
func TestTenantLabels(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	alpha := tenant.With(context.Background(), tenant.Tenant{Name: "alpha"})
	admin := tenant.Admin(context.Background())
	r, err := c.Reset(alpha, ResetRequest{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseEnv(admin, r.Env.ID)
	if l := r.Env.Labels(); l[labelTenant] != "alpha" || l[labelServed] != "1" {
		t.Errorf("alpha's env labelled %v", l)
	}
	eph, err := c.Reset(alpha, ResetRequest{Image: "busybox", Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseEnv(admin, eph.Env.ID)
	if l := eph.Env.Labels(); l[labelTenant] != "alpha" || l[labelServed] != "" {
		t.Errorf("alpha's ephemeral env labelled %v", l)
	}
	res, err := c.Branch(admin, BranchRequest{EnvID: r.Env.ID, N: 1})
	if err != nil || res.Children[0] == nil {
		t.Fatal(err, res)
	}
	defer c.CloseEnv(admin, res.Children[0].ID)
	if l := res.Children[0].Labels(); l[labelTenant] != "alpha" {
		t.Errorf("the admin's child of alpha's env labelled %v, want alpha's", l)
	}
	if envs := c.Envs(tenant.With(context.Background(), tenant.Tenant{Name: "beta"})); len(envs) != 0 {
		t.Errorf("beta sees %d envs of alpha's", len(envs))
	}
}
