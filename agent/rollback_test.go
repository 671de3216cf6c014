package agent_test

import (
	"context"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/agent"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/coordinator"
)

// TestRollbackWhileCheckpointRuns: the rollback tool accepts a state on
// the env's lineage that neither its log nor the env itself made (the
// parent's state before the branch point) while the env's newest
// checkpoint is still running. The queue is held so that checkpoint
// cannot finish first.
func TestRollbackWhileCheckpointRuns(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	// An engine of its own: no other test's work may take the workers
	// HoldQueue holds.
	rig := branchtest.ForTest(t, branchtest.Options{})
	engine := rig.Engine
	ctx := context.Background()
	co, err := coordinator.New(coordinator.Options{Engine: engine, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(co.Close)
	tools, err := agent.New(agent.Options{Coordinator: co, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	reset, err := co.Reset(ctx, coordinator.ResetRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	parent, first := reset.Env, reset.StateID
	t.Cleanup(func() { co.CloseEnv(context.Background(), parent.ID) })
	ps, err := tools.Attach(parent.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Bash(ctx, agent.BashArgs{Cmd: "echo 2 > /tmp/n"}); err != nil {
		t.Fatal(err)
	}
	br, err := co.Branch(ctx, coordinator.BranchRequest{EnvID: parent.ID, N: 1})
	if err != nil || br.Errors[0] != nil {
		t.Fatalf("branch: %v %v", err, br.Errors)
	}
	child := br.Children[0]
	t.Cleanup(func() { co.CloseEnv(context.Background(), child.ID) })
	s, err := tools.Attach(child.ID, "")
	if err != nil {
		t.Fatal(err)
	}

	release := branchtest.HoldQueue(t, engine, "busybox")
	r, err := s.Bash(ctx, agent.BashArgs{Cmd: "echo 3 > /tmp/n"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.State(r.StateID); err == nil {
		t.Fatalf("the child's checkpoint %s ran while the queue was held", r.StateID)
	}
	type answer struct {
		r   *agent.RollbackResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := s.Rollback(ctx, agent.RollbackArgs{StateID: first})
		done <- answer{r, err}
	}()
	// Let the queue go once the rollback waits for the child's checkpoint
	// (the gate raised it); an answer before that did not wait.
	a := branchtest.ReleaseWhenRaised(engine, release, done)
	if a.err != nil {
		t.Fatalf("rollback to the parent's first state %s: %v", first, a.err)
	}
	// Two states of the child's history are undone: the branch point and
	// the one the held checkpoint made. The turn is the episode's (the
	// reset's state: 0), as info.turn counts it.
	if a.r.StateID != first || a.r.Turn != 0 || a.r.Undone != 2 {
		t.Errorf("rollback: %+v", a.r)
	}
	out, err := s.Bash(ctx, agent.BashArgs{Cmd: "cat /tmp/n || echo none"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.Stdout); got != "none" {
		t.Errorf("after the rollback: %q, want none", got)
	}
}
