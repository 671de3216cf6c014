package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// TestTurnKinds: a turn is checkpointed with the kind its classification
// says (an error of the classifier makes it full), a read-only turn is
// none without asking, and the state after a turn restores to what the
// turn left.
func TestTurnKinds(t *testing.T) {
	k := &kinds{next: []state.Kind{state.FS, state.None}}
	c := newCoordinator(t, Options{Classify: k.classify})
	r := reset(t, c, ResetRequest{Image: "busybox"})
	ctx := context.Background()

	t1 := bash(t, c, r.Env.ID, "echo one > /tmp/f")
	if t1.Kind != state.FS || t1.StateID == r.StateID || t1.Turn != 1 || t1.Result.ExitCode != 0 {
		t.Errorf("turn 1: kind %s state %s turn %d exit %d, want fs, a new state, turn 1, exit 0", t1.Kind, t1.StateID, t1.Turn, t1.Result.ExitCode)
	}
	t2 := bash(t, c, r.Env.ID, "true")
	if t2.Kind != state.None || t2.StateID != t1.StateID {
		t.Errorf("turn 2: kind %s state %s, want none and %s", t2.Kind, t2.StateID, t1.StateID)
	}
	rd, err := c.Turn(ctx, r.Env.ID, Action{Tool: state.ToolReadFile, Path: "/tmp/f", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if rd.Kind != state.None || string(rd.Result.Stdout) != "one\n" {
		t.Errorf("read-only turn: kind %s stdout %q", rd.Kind, rd.Result.Stdout)
	}
	// The classifier has no kind left: its error makes the turn full.
	t4 := bash(t, c, r.Env.ID, "echo two > /tmp/f")
	if t4.Kind != state.Full {
		t.Errorf("turn whose classification failed: kind %s, want full", t4.Kind)
	}
	if want := []string{"echo one > /tmp/f", "true", "echo two > /tmp/f"}; !slices.Equal(k.seen, want) {
		t.Errorf("classified %q, want %q (read-only turns are not classified)", k.seen, want)
	}
	// Turn 1's state restores with its file.
	back, err := c.Rollback(ctx, r.Env.ID, t1.StateID)
	if err != nil {
		t.Fatal(err)
	}
	if back.Turn != 1 {
		t.Errorf("rollback to turn 1's state: turn %d", back.Turn)
	}
	if got := bash(t, c, r.Env.ID, "cat /tmp/f").Result.Stdout; string(got) != "one\n" {
		t.Errorf("after rollback /tmp/f = %q, want one", got)
	}
}

// TestTurnInspector: without a seam the engine's inspector classifies
// (the one entry point): a turn that changed nothing is none, one that
// wrote a file is not.
func TestTurnInspector(t *testing.T) {
	c := newCoordinator(t, Options{})
	r := reset(t, c, ResetRequest{Image: "busybox"})
	bash(t, c, r.Env.ID, "true") // the first turn after reset settles the baseline
	if got := bash(t, c, r.Env.ID, "echo hi > /tmp/x").Kind; got == state.None {
		t.Errorf("a turn that wrote a file was checkpointed %s", got)
	}
	if got := bash(t, c, r.Env.ID, "true").Kind; got != state.None {
		t.Errorf("a turn that changed nothing was checkpointed %s, want none", got)
	}
}

// TestTurnAfterFailedCheckpoint: when the previous turn's background
// checkpoint failed and WaitTurn (the LLM proxy's wait) took the failure
// from the engine, the next turn still says why and is checkpointed full
// whatever its classification. (TestTurnAfterRealCheckpointFailure is the
// path where the next turn's exec finds the failure.)
func TestTurnAfterFailedCheckpoint(t *testing.T) {
	k := &kinds{next: []state.Kind{state.Proc, state.None, state.None}}
	c := newCoordinator(t, Options{Classify: k.classify})
	r := reset(t, c, ResetRequest{Image: "busybox"})
	ctx := context.Background()
	ghost := bash(t, c, r.Env.ID, ghostCmd)
	if string(ghost.Result.Stdout) != "ok\n" || ghost.Kind != state.Proc {
		t.Fatalf("turn 1: %q kind %s", ghost.Result.Stdout, ghost.Kind)
	}
	waited := c.WaitTurn(ctx, r.Env.ID)
	if !errors.Is(waited, state.ErrCheckpoint) {
		t.Fatalf("WaitTurn on a checkpoint that fails: %v, want state.ErrCheckpoint", waited)
	}
	t1 := bash(t, c, r.Env.ID, "kill $(pidof sleep); wait 2>/dev/null; true")
	if t1.Kind != state.Full || t1.CheckpointError == nil || t1.CheckpointError.Error() != waited.Error() {
		t.Errorf("turn after a failed checkpoint: kind %s, error %v; want full and %v", t1.Kind, t1.CheckpointError, waited)
	}
	if err := c.WaitTurn(ctx, r.Env.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.State(t1.StateID); err != nil {
		t.Errorf("the full state %s is not committed: %v", t1.StateID, err)
	}
	if t2 := bash(t, c, r.Env.ID, "true"); t2.Kind != state.None || t2.CheckpointError != nil {
		t.Errorf("the turn after: kind %s, error %v; want none and no error", t2.Kind, t2.CheckpointError)
	}
}

// TestTurnMaxTurnsAndTimeouts: the task's MaxTurns truncates the episode
// at its last turn; the task's command timeout, an action's own timeout
// and the coordinator's cap reach the result. Each command sleeps between
// the timeout that should apply and the one that would apply without the
// rule, so each check fails if its rule is broken.
func TestTurnMaxTurnsAndTimeouts(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full, MaxTimeout: 5 * time.Second})
	r := reset(t, c, ResetRequest{Task: "count"})
	ctx := context.Background()
	if r.Task.Name != "count" || r.Task.MaxTurns != 3 || r.Task.CommandTimeout != 2*time.Second {
		t.Fatalf("reset task %+v", r.Task)
	}
	// The task's timeout (2 s) applies when the action gives none;
	// without it the cap (5 s) would let the command finish.
	t1 := bash(t, c, r.Env.ID, "sleep 3; echo done")
	if !t1.Result.TimedOut || string(t1.Result.Stdout) != "" || t1.Truncated {
		t.Errorf("turn 1 (sleep 3, task timeout 2 s): timed out %v, stdout %q, truncated %v", t1.Result.TimedOut, t1.Result.Stdout, t1.Truncated)
	}
	// The action's own timeout (4.5 s, under the cap) wins over the
	// task's, which would cut the command.
	t2, err := c.Turn(ctx, r.Env.ID, Action{Tool: "bash", Cmd: "sleep 3; echo done", Timeout: 4500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if t2.Result.TimedOut || string(t2.Result.Stdout) != "done\n" || t2.Truncated {
		t.Errorf("turn 2 (own timeout 4.5 s): timed out %v, stdout %q, truncated %v", t2.Result.TimedOut, t2.Result.Stdout, t2.Truncated)
	}
	// Over the cap (5 s): cut at the cap, where the action's hour would
	// let it finish. This is turn 3 of 3: truncated.
	t3, err := c.Turn(ctx, r.Env.ID, Action{Tool: "bash", Cmd: "sleep 8; echo done", Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !t3.Result.TimedOut || string(t3.Result.Stdout) != "" || t3.Turn != 3 || !t3.Truncated {
		t.Errorf("turn 3 (timeout over the cap): timed out %v, stdout %q, turn %d, truncated %v; want true, none, 3, true",
			t3.Result.TimedOut, t3.Result.Stdout, t3.Turn, t3.Truncated)
	}
	// Truncated, the episode takes no more steps (docs/protocol.md,
	// "Episode end"): the command does not run.
	if t4, err := c.Turn(ctx, r.Env.ID, Action{Tool: "bash", Cmd: "touch /tmp/ran"}); !errors.Is(err, state.ErrInvalid) || !strings.Contains(fmt.Sprint(err), "episode is over") {
		t.Errorf("turn 4 of 3: %+v, %v; want the episode over (bad request)", t4, err)
	}
	// A rollback to an earlier state opens it again.
	if _, err := c.Rollback(ctx, r.Env.ID, t1.StateID); err != nil {
		t.Fatal(err)
	}
	if t2b := bash(t, c, r.Env.ID, "test ! -e /tmp/ran && echo again"); string(t2b.Result.Stdout) != "again\n" || t2b.Turn != 2 || t2b.Truncated {
		t.Errorf("after a rollback to turn 1: stdout %q, turn %d, truncated %v; want again, 2, false", t2b.Result.Stdout, t2b.Turn, t2b.Truncated)
	}
}

// TestRollbackTurn: the rollback tool refuses a state the env never had
// (in the result, not as an error) and restores one it had.
func TestRollbackTurn(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	r := reset(t, c, ResetRequest{Image: "busybox"})
	ctx := context.Background()
	t1 := bash(t, c, r.Env.ID, "cd /tmp && echo a > f")
	bash(t, c, r.Env.ID, "echo b > f")
	bad, err := c.Turn(ctx, r.Env.ID, Action{Tool: state.ToolRollback, StateID: "s-nope"})
	if err != nil {
		t.Fatal(err)
	}
	if bad.Rejected == "" || bad.Result.ExitCode != 2 || bad.Restored != "" {
		t.Errorf("rollback to an unknown state: %+v", bad)
	}
	// t1's state id is returned while its checkpoint may still run: the
	// rollback waits for it.
	ok, err := c.Turn(ctx, r.Env.ID, Action{Tool: state.ToolRollback, StateID: t1.StateID})
	if err != nil {
		t.Fatal(err)
	}
	if ok.Rejected != "" || ok.Restored != t1.StateID || ok.Turn != 1 || ok.Result.Cwd != "/tmp" {
		t.Errorf("rollback to turn 1: rejected %q restored %s turn %d cwd %q", ok.Rejected, ok.Restored, ok.Turn, ok.Result.Cwd)
	}
	if got := bash(t, c, r.Env.ID, "cat f").Result.Stdout; string(got) != "a\n" {
		t.Errorf("after rollback f = %q", got)
	}
}

// TestBoundary: a turn without a command (the LLM proxy's) is classified
// by the inspector and checkpointed; WaitTurn returns once it is
// committed.
func TestBoundary(t *testing.T) {
	c := newCoordinator(t, Options{})
	r := reset(t, c, ResetRequest{Image: "busybox"})
	ctx := context.Background()
	if _, err := engine.Exec(ctx, r.Env, "echo edited > /tmp/b", sandboxOpts()); err != nil {
		t.Fatal(err)
	}
	b, err := c.Boundary(ctx, r.Env.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.Kind == state.None || b.StateID == r.StateID {
		t.Errorf("boundary after an edit: kind %s state %s", b.Kind, b.StateID)
	}
	if err := c.WaitTurn(ctx, r.Env.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.State(b.StateID); err != nil {
		t.Errorf("state %s not committed after WaitTurn: %v", b.StateID, err)
	}
	if _, err := c.Boundary(ctx, "e-nope"); !errors.Is(err, state.ErrUnknownEnv) {
		t.Errorf("boundary of an unknown env: %v", err)
	}
}

// TestTurnAfterRealCheckpointFailure: a background checkpoint that really
// fails (CRIU refuses to dump a deleted file over its 64 MiB ghost limit
// that a process still holds open) is reported by the next turn, whose
// checkpoint is full and, the process gone, commits.
func TestTurnAfterRealCheckpointFailure(t *testing.T) {
	k := &kinds{next: []state.Kind{state.Proc, state.None}}
	c := newCoordinator(t, Options{Classify: k.classify})
	r := reset(t, c, ResetRequest{Image: "busybox"})
	ghost := bash(t, c, r.Env.ID, ghostCmd)
	if string(ghost.Result.Stdout) != "ok\n" || ghost.Kind != state.Proc {
		t.Fatalf("turn 1: %q kind %s", ghost.Result.Stdout, ghost.Kind)
	}
	// The next turn waits for turn 1's checkpoint, which fails.
	next := bash(t, c, r.Env.ID, "kill $(pidof sleep); wait 2>/dev/null; true")
	if next.CheckpointError == nil || next.Kind != state.Full {
		t.Fatalf("turn after a failed dump: error %v, kind %s; want the failure and full", next.CheckpointError, next.Kind)
	}
	if !errors.Is(next.CheckpointError, state.ErrCheckpoint) {
		t.Errorf("checkpoint error %v is not state.ErrCheckpoint", next.CheckpointError)
	}
	if _, err := engine.State(ghost.StateID); err == nil {
		t.Errorf("the failed state %s is in the manifest", ghost.StateID)
	}
	if err := c.WaitTurn(context.Background(), r.Env.ID); err != nil {
		t.Fatalf("the full checkpoint after the failure: %v", err)
	}
	if _, err := engine.State(next.StateID); err != nil {
		t.Errorf("state %s not committed: %v", next.StateID, err)
	}
}

// ownCoordinator is a coordinator on an engine of the test's own (one
// HoldQueue may hold: no other test's work takes its workers).
func ownCoordinator(t *testing.T, o Options) (*Coordinator, *branch.Engine) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	e := branchtest.ForTest(t, branchtest.Options{}).Engine
	o.Engine, o.Logger = e, branchtest.Logger()
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, e
}

// ghostCmd makes every dump of the env fail until sleep is killed.
const ghostCmd = branchtest.GhostHolder

// TestBoundaryAfterFailedCheckpoint: a boundary whose previous turn's
// checkpoint is still queued waits for it before it applies the rule of
// a turn; when it failed, the boundary reports the failure and its
// checkpoint is full. The queue is held so that the failing checkpoint is
// still pending when the boundary starts.
func TestBoundaryAfterFailedCheckpoint(t *testing.T) {
	k := &kinds{next: []state.Kind{state.Proc, state.None}}
	c, e := ownCoordinator(t, Options{Classify: k.classify})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	if err := c.WaitTurn(ctx, r.Env.ID); err != nil {
		t.Fatal(err)
	}
	release := branchtest.HoldQueue(t, e, "busybox")
	ghost := bash(t, c, r.Env.ID, ghostCmd)
	if ghost.Kind != state.Proc {
		t.Fatalf("turn 1: kind %s", ghost.Kind)
	}
	if _, err := e.State(ghost.StateID); err == nil {
		t.Fatalf("turn 1's checkpoint %s ran while the queue was held", ghost.StateID)
	}
	type answer struct {
		r   *TurnResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		b, err := c.Boundary(ctx, r.Env.ID)
		done <- answer{b, err}
	}()
	// Let the queue go once the boundary waits for turn 1's checkpoint.
	branchtest.WaitFor(t, "the boundary to wait for turn 1's checkpoint", func() bool { return branchtest.RaisedWaiting(e) })
	release()
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if !errors.Is(a.r.CheckpointError, state.ErrCheckpoint) || a.r.Kind != state.Full {
		t.Errorf("boundary after a failed checkpoint: error %v, kind %s; want the failure and full", a.r.CheckpointError, a.r.Kind)
	}
}

// TestHeadAfterFailedCheckpoint: Head of an env whose background
// checkpoint failed checkpoints the changes no state holds (full) and
// says so, instead of answering the old failure.
func TestHeadAfterFailedCheckpoint(t *testing.T) {
	k := &kinds{next: []state.Kind{state.Proc}}
	c := newCoordinator(t, Options{Classify: k.classify})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	ghost := bash(t, c, r.Env.ID, ghostCmd)
	// The engine's gate finds the failure (nobody takes it yet); the
	// process goes, so that the next dump can succeed.
	if _, err := engine.WaitCheckpoint(ctx, r.Env); err != nil {
		t.Fatal(err)
	}
	if res, err := r.Env.Sandbox().Exec(ctx, "kill $(pidof sleep); wait 2>/dev/null; true", sandboxOpts()); err != nil || res.ExitCode != 0 {
		t.Fatalf("kill the ghost holder: %v %+v", err, res)
	}
	head, remade, err := c.Head(ctx, r.Env.ID)
	if err != nil {
		t.Fatalf("head after a failed checkpoint: %v", err)
	}
	if !remade || head == ghost.StateID {
		t.Errorf("head %s remade %v; want a new state (not the failed %s) and remade", head, remade, ghost.StateID)
	}
	st, err := engine.State(head)
	if err != nil || st.Kind != state.Full {
		t.Errorf("head state %s: %+v %v, want a committed full state", head, st, err)
	}
}

// TestSettleFailedState: a branch from a state id whose checkpoint
// failed answers that failure's cause, here env_error (the agent's
// deleted file over the ghost limit; the state never came to be: not
// retryable), and the failure stays with the env that made it, whose next
// turn reports it and is full.
func TestSettleFailedState(t *testing.T) {
	k := &kinds{next: []state.Kind{state.Proc, state.None}}
	c := newCoordinator(t, Options{Classify: k.classify})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	ghost := bash(t, c, r.Env.ID, ghostCmd)
	_, err := c.Branch(ctx, BranchRequest{StateID: ghost.StateID, N: 1})
	if pe := protocol.ErrorOf(err); pe == nil || pe.Code != protocol.CodeEnvError || pe.Retryable || pe.Infra {
		t.Errorf("branch from a state whose checkpoint failed: %v (%+v), want env_error, neither retryable nor infra", err, pe)
	}
	if !errors.Is(err, state.ErrCheckpoint) {
		t.Errorf("branch from a failed state: %v does not say the checkpoint failed", err)
	}
	// The rollback tool to it: the agent's mistake, in the observation.
	rb, err := c.Turn(ctx, r.Env.ID, Action{Tool: state.ToolRollback, StateID: ghost.StateID})
	if err != nil || rb.Rejected == "" || rb.Result.ExitCode != 2 {
		t.Errorf("rollback tool to a state whose checkpoint failed: %+v %v, want rejected", rb, err)
	}
	next := bash(t, c, r.Env.ID, "kill $(pidof sleep); wait 2>/dev/null; true")
	if !errors.Is(next.CheckpointError, state.ErrCheckpoint) || next.Kind != state.Full {
		t.Errorf("the failed state's env, next turn: error %v, kind %s; want the failure and full", next.CheckpointError, next.Kind)
	}
}

// TestCheckpointAfterFailedCheckpoint: a forced checkpoint after a failed
// background one succeeds (it answered the old failure), and the next
// turn still reports that failure.
func TestCheckpointAfterFailedCheckpoint(t *testing.T) {
	k := &kinds{next: []state.Kind{state.Proc, state.None}}
	c := newCoordinator(t, Options{Classify: k.classify})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	bash(t, c, r.Env.ID, ghostCmd)
	if _, err := engine.WaitCheckpoint(ctx, r.Env); err != nil {
		t.Fatal(err)
	}
	if res, err := r.Env.Sandbox().Exec(ctx, "kill $(pidof sleep); wait 2>/dev/null; true", sandboxOpts()); err != nil || res.ExitCode != 0 {
		t.Fatalf("kill the ghost holder: %v %+v", err, res)
	}
	sid, err := c.Checkpoint(ctx, r.Env.ID)
	if err != nil {
		t.Fatalf("forced checkpoint after a failed one: %v", err)
	}
	if st, err := engine.State(sid); err != nil || st.Kind != state.Full {
		t.Errorf("forced state %s: %+v %v, want committed full", sid, st, err)
	}
	if next := bash(t, c, r.Env.ID, "true"); !errors.Is(next.CheckpointError, state.ErrCheckpoint) {
		t.Errorf("the turn after: checkpoint error %v, want the earlier failure", next.CheckpointError)
	}
}
