package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
)

// did is a step a test made and what it returned: what a trajectory must
// give back for that turn.
type did struct {
	env string
	a   arbor.Action
	res *arbor.StepResult
}

// act runs a step and returns what it did.
func act(t *testing.T, c *arbor.Client, env string, a arbor.Action) did {
	t.Helper()
	r, err := c.Step(context.Background(), env, a)
	if err != nil {
		t.Fatalf("step %+v in %s: %v", a, env, err)
	}
	return did{env: env, a: a, res: r}
}

// wantPath checks that a trajectory is exactly the turns want, in order:
// each the action as sent, the observation as the step returned it, the
// state and checkpoint kind the step reported, and the env that ran it.
func wantPath(t *testing.T, what string, got *arbor.TrajectoryResult, want ...did) {
	t.Helper()
	var gotCmds, wantCmds []string
	for _, x := range got.Turns {
		gotCmds = append(gotCmds, x.Action.Tool+":"+x.Action.Cmd+x.Action.Path)
	}
	for _, w := range want {
		wantCmds = append(wantCmds, w.a.Tool+":"+w.a.Cmd+w.a.Path)
	}
	if !slices.Equal(gotCmds, wantCmds) {
		t.Fatalf("%s: turns %q, want %q", what, gotCmds, wantCmds)
	}
	for i, w := range want {
		x, r := got.Turns[i], w.res
		errs := []string{}
		check := func(field string, g, e any) {
			if fmt.Sprint(g) != fmt.Sprint(e) {
				errs = append(errs, fmt.Sprintf("%s %v, want %v", field, g, e))
			}
		}
		check("env_id", x.EnvID, w.env)
		check("state_id", x.StateID, r.Info.StateID)
		check("checkpoint", x.Checkpoint, r.Info.Checkpoint)
		check("turn", x.Turn, r.Info.Turn)
		check("stdout", fmt.Sprintf("%q", x.Obs.Stdout), fmt.Sprintf("%q", r.Obs.Stdout))
		check("stderr", fmt.Sprintf("%q", x.Obs.Stderr), fmt.Sprintf("%q", r.Obs.Stderr))
		check("exit_code", x.Obs.ExitCode, r.Obs.ExitCode)
		check("truncated", x.Obs.Truncated, r.Obs.Truncated)
		check("timed_out", x.Obs.TimedOut, r.Obs.TimedOut)
		check("cwd", x.Obs.Cwd, r.Obs.Cwd)
		check("duration_s", x.Obs.DurationS, r.Obs.DurationS)
		check("timeout_s", x.Action.TimeoutS, w.a.TimeoutS)
		if !bytes.Equal(x.Action.Content, w.a.Content) {
			errs = append(errs, fmt.Sprintf("content %q, want %q", x.Action.Content, w.a.Content))
		}
		if x.Started == "" || x.StepS <= 0 || x.StepS < x.Obs.DurationS {
			errs = append(errs, fmt.Sprintf("timings: started %q, step_s %v (command %v)", x.Started, x.StepS, x.Obs.DurationS))
		}
		if x.Checkpoint != "none" && x.Parent == x.StateID || x.Checkpoint == "none" && x.Parent != x.StateID {
			errs = append(errs, fmt.Sprintf("parent %s of a %s turn to %s", x.Parent, x.Checkpoint, x.StateID))
		}
		if len(errs) > 0 {
			t.Errorf("%s: turn %d (%s): %v", what, i, wantCmds[i], errs)
		}
	}
}

// TestTrajectory drives a tree over a real server and sandboxes, with the
// engine's inspector classifying turns: an env steps (a turn that changes
// nothing among them), is branched as an env and from a state id, the
// children step (write_file and read_file with binary content, a
// rollback tool), one is evaluated, the parent rolls back and goes on.
// From another connection, after the first is gone, every leaf's
// trajectory is exactly its path's actions and observations: a child of
// the env has the parent's turns up to the fork, a child of a state the
// turns up to the one that made it, a rolled-back env the path to the
// state it restored and then its new turns. The evaluated state carries
// its reward; a closed env's pinned state still answers; unknown states
// and envs and bad params answer their errors.
func TestTrajectory(t *testing.T) {
	_, addr := newServerWith(t, server.Options{}, coordinator.Options{Classify: engine.Classify})
	ctx := context.Background()
	c := dial(t, addr, nil)
	reset, err := c.Reset(ctx, arbor.ResetParams{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	a := reset.EnvID
	bash := func(cmd string) arbor.Action { return arbor.Bash(cmd, 20*time.Second) }
	t1 := act(t, c, a, bash("echo 1 > /work/n; echo one"))
	t2 := act(t, c, a, bash("echo nothing changes"))
	if t2.res.Info.Checkpoint != "none" || t2.res.Info.StateID != t1.res.Info.StateID {
		t.Logf("a read-only turn was classified %s (state %s after %s)", t2.res.Info.Checkpoint, t2.res.Info.StateID, t1.res.Info.StateID)
	}
	t3 := act(t, c, a, bash("echo 2 > /work/n; echo two >&2; false"))
	if t3.res.Obs.ExitCode != 1 {
		t.Fatalf("exit code %d, want 1", t3.res.Obs.ExitCode)
	}
	kids, err := c.Branch(ctx, arbor.BranchParams{EnvID: a, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	b := kids.EnvIDs[0]
	kids, err = c.Branch(ctx, arbor.BranchParams{StateID: t2.res.Info.StateID, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	ch := kids.EnvIDs[0]
	b4 := act(t, c, b, bash("echo 3 > /work/n; cat /work/n"))
	if ev, err := c.Evaluate(ctx, b); err != nil || ev.Reward != 1 {
		t.Fatalf("evaluate: %+v, %v; want reward 1", ev, err)
	}
	c4 := act(t, c, ch, arbor.Action{Tool: "write_file", Path: "/work/bin", Content: []byte{0, 0xff, 'x', '\n'}})
	c5 := act(t, c, ch, arbor.Action{Tool: "read_file", Path: "/work/bin"})
	if !bytes.Equal([]byte(c5.res.Obs.Stdout), []byte{0, 0xff, 'x', '\n'}) {
		t.Fatalf("read_file: %q", c5.res.Obs.Stdout)
	}
	if c5.res.Info.Checkpoint != "none" {
		t.Fatalf("read_file was checkpointed %s", c5.res.Info.Checkpoint)
	}
	beforeRollback, err := c.Trajectory(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	if r := act(t, c, ch, arbor.Action{Tool: "rollback", StateID: t1.res.Info.StateID}); r.res.Info.Restored != t1.res.Info.StateID {
		t.Fatalf("rollback tool: %+v", r.res)
	}
	c7 := act(t, c, ch, bash("cat /work/n"))
	if _, err := c.Rollback(ctx, a, t1.res.Info.StateID); err != nil {
		t.Fatal(err)
	}
	a5 := act(t, c, a, bash("echo 5 > /work/n"))
	if err := c.Pin(ctx, b4.res.Info.StateID); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseEnv(ctx, b); err != nil {
		t.Fatal(err)
	}
	c.Close()

	// A new connection: what the first client did is on the server.
	c = dial(t, addr, nil)
	defer c.Unpin(ctx, b4.res.Info.StateID)
	get := func(env, state string) *arbor.TrajectoryResult {
		t.Helper()
		var r *arbor.TrajectoryResult
		var err error
		if env != "" {
			r, err = c.Trajectory(ctx, env)
		} else {
			r, err = c.StateTrajectory(ctx, state)
		}
		if err != nil {
			t.Fatalf("trajectory of %s%s: %v", env, state, err)
		}
		if r.Root != reset.Info.StateID || len(r.Missing) > 0 {
			t.Fatalf("trajectory of %s%s: root %s (want %s), missing %v", env, state, r.Root, reset.Info.StateID, r.Missing)
		}
		return r
	}
	rolledBack := get(a, "")
	wantPath(t, "env rolled back", rolledBack, t1, a5)
	if rolledBack.StateID != a5.res.Info.StateID || rolledBack.EnvID != a {
		t.Errorf("env rolled back: ends at %s (env %s), want %s", rolledBack.StateID, rolledBack.EnvID, a5.res.Info.StateID)
	}
	wantPath(t, "state before the rollback", get("", t3.res.Info.StateID), t1, t2, t3)
	evaluated := get("", b4.res.Info.StateID)
	wantPath(t, "closed child of the env, pinned", evaluated, t1, t2, t3, b4)
	for i, x := range evaluated.Turns {
		last := i == len(evaluated.Turns)-1
		if last && (x.Reward == nil || *x.Reward != 1 || x.RewardDetails == nil) {
			t.Errorf("evaluated turn: reward %v, details %v; want 1", x.Reward, x.RewardDetails)
		}
		if !last && x.Reward != nil {
			t.Errorf("turn %d: reward %v, but its state was never evaluated", i, *x.Reward)
		}
	}
	if last := evaluated.Turns[len(evaluated.Turns)-1]; last.CheckpointS <= 0 {
		t.Errorf("the turn that made %s: checkpoint_s %v", last.StateID, last.CheckpointS)
	}
	// The env's path has its turns that took no checkpoint (read_file);
	// the state's ends with the turn that made it.
	wantPath(t, "child of a state, before its rollback tool", beforeRollback, t1, c4, c5)
	if got := beforeRollback.Turns[2].Obs.Stdout; got != "\x00\xffx\n" {
		t.Errorf("binary stdout came back as %q", got)
	}
	wantPath(t, "the state read_file returned", get("", c5.res.Info.StateID), t1, c4)
	wantPath(t, "child of a state, after its rollback tool", get(ch, ""), t1, c7)

	if _, err := c.StateTrajectory(ctx, "s-nosuch"); !errors.Is(err, arbor.ErrUnknownState) {
		t.Errorf("trajectory of an unknown state: %v, want unknown_state", err)
	}
	if _, err := c.Trajectory(ctx, b); !errors.Is(err, arbor.ErrUnknownEnv) {
		t.Errorf("trajectory of a closed env: %v, want unknown_env", err)
	}
	for _, p := range []map[string]any{{}, {"env_id": a, "state_id": t1.res.Info.StateID}, {"state_id": 7}} {
		if err := c.Call(ctx, "trajectory", p, nil); !errors.Is(err, arbor.ErrInvalidParams) {
			t.Errorf("trajectory %v: %v, want invalid_params", p, err)
		}
	}
	hello, err := c.Hello(ctx, "")
	if err != nil || !slices.Contains(hello.Capabilities.Methods, "trajectory") {
		t.Errorf("hello: methods %v (%v) lack trajectory", hello.Capabilities.Methods, err)
	}
	for _, id := range []string{a, ch} {
		if err := c.CloseEnv(ctx, id); err != nil {
			t.Error(err)
		}
	}
}

// TestTrajectoryOutputCap: a turn's record keeps at most the coordinator's
// cap of each stream, head and tail, and says so; the step itself
// returned all of it.
func TestTrajectoryOutputCap(t *testing.T) {
	_, addr := newServerWith(t, server.Options{}, coordinator.Options{TrajectoryOutput: 1000})
	ctx := context.Background()
	c := dial(t, addr, nil)
	reset, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseEnv(ctx, reset.EnvID)
	r := sh(t, c, reset.EnvID, "i=0; while [ $i -lt 500 ]; do echo line$i; i=$((i+1)); done")
	if r.Obs.Truncated || len(r.Obs.Stdout) < 3000 {
		t.Fatalf("step returned %d bytes (truncated %v)", len(r.Obs.Stdout), r.Obs.Truncated)
	}
	tr, err := c.Trajectory(ctx, reset.EnvID)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Turns) != 1 {
		t.Fatalf("%d turns, want 1", len(tr.Turns))
	}
	x := tr.Turns[0]
	head, tail := string(r.Obs.Stdout[:500]), string(r.Obs.Stdout[len(r.Obs.Stdout)-500:])
	if !x.OutputCut || x.StdoutBytes != int64(len(r.Obs.Stdout)) || len(x.Obs.Stdout) > 1100 ||
		string(x.Obs.Stdout[:500]) != head || string(x.Obs.Stdout[len(x.Obs.Stdout)-500:]) != tail {
		t.Fatalf("recorded stdout of %d bytes (cut %v, stdout_bytes %d): %q", len(x.Obs.Stdout), x.OutputCut, x.StdoutBytes, x.Obs.Stdout)
	}
}
