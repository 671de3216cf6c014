package server_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch/branchtest"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/server"
)

// TestRollbackToolWhileCheckpointRuns: the rollback tool accepts a child's
// branch point (a state on its lineage that another env made) while the
// child's newest checkpoint is still running. The queue is held, so that
// checkpoint cannot win the race by finishing first, as it usually did in
// TestEpisode (which failed on this once in two runs on a loaded machine).
func TestRollbackToolWhileCheckpointRuns(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	// An engine of its own: no other test's work may take the workers
	// HoldQueue holds.
	e := branchtest.ForTest(t, branchtest.Options{}).Engine
	co, err := coordinator.New(coordinator.Options{Engine: e, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(co.Close)
	s, err := server.New(server.Options{Coordinator: co, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		hs.Close()
	})
	addr := strings.TrimPrefix(hs.URL, "http://")
	ctx := context.Background()
	c := dial(t, addr, nil)
	reset, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	parent := reset.EnvID
	t.Cleanup(func() { c.CloseEnv(context.Background(), parent) })
	sh(t, c, parent, "echo 2 > /tmp/n")
	br, err := c.Branch(ctx, arbor.BranchParams{EnvID: parent, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	child := br.EnvIDs[0]
	t.Cleanup(func() { c.CloseEnv(context.Background(), child) })

	release := branchtest.HoldQueue(t, e, "busybox")
	step := sh(t, c, child, "echo 3 > /tmp/n")
	if _, err := e.State(step.Info.StateID); err == nil {
		t.Fatalf("the child's checkpoint %s ran while the queue was held", step.Info.StateID)
	}
	type answer struct {
		r   *arbor.StepResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := c.Step(ctx, child, arbor.RollbackTo(br.StateID))
		done <- answer{r, err}
	}()
	// Let the queue go once the rollback waits for the child's checkpoint
	// (the gate raised it); an answer before that did not wait.
	a := branchtest.ReleaseWhenRaised(e, release, done)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.r.Obs.ExitCode != 0 || a.r.Info.Restored != br.StateID {
		t.Fatalf("rollback tool to the branch point %s: exit %d, stderr %q, info %+v", br.StateID, a.r.Obs.ExitCode, a.r.Obs.Stderr, a.r.Info)
	}
	if got := strings.TrimSpace(string(sh(t, c, child, "cat /tmp/n").Obs.Stdout)); got != "2" {
		t.Errorf("after the rollback tool: %q, want 2", got)
	}
}

// lineageTasks are two busybox tasks whose setup leaves different files.
var lineageTasks = []envpool.Task{
	{Name: "left", Image: "busybox", Setup: []string{"echo left > /f"}, Verifier: `grep -q left /f && echo 1 || echo 0`},
	{Name: "right", Image: "busybox", Setup: []string{"echo right > /f"}, Verifier: `grep -q right /f && echo 1 || echo 0`},
}

// TestRollbackStaysInItsTask: the rollback method refuses a state of
// another task's lineage (open or closed env), or of an env without a
// task for a task's env and back, with bad_request naming both, and
// leaves the env as it was; states of the env's own task (its branch, a
// sibling's) and, between envs without a task, of the same image, are
// restored.
func TestRollbackStaysInItsTask(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	ctx := context.Background()
	p, err := envpool.NewPool(ctx, engine, lineageTasks, envpool.PoolOptions{Warm: -1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	_, addr := newServerWith(t, server.Options{}, coordinator.Options{Tasks: coordinator.FromEnvpool(p)})
	c := dial(t, addr, nil)

	a := reset(t, c, arbor.ResetParams{Task: "left"})
	sh(t, c, a, "echo a > /g")
	sibling := reset(t, c, arbor.ResetParams{Task: "left"})
	sSibling := sh(t, c, sibling, "echo sibling > /g").Info.StateID
	br, err := c.Branch(ctx, arbor.BranchParams{EnvID: a, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseEnv(context.Background(), br.EnvIDs[0]) })
	sChild := sh(t, c, br.EnvIDs[0], "echo child > /g").Info.StateID
	sA := sh(t, c, a, "echo a2 > /g").Info.StateID
	b := reset(t, c, arbor.ResetParams{Task: "right"})
	sB := sh(t, c, b, "echo b > /g").Info.StateID
	closed, err := c.Reset(ctx, arbor.ResetParams{Task: "right"})
	if err != nil {
		t.Fatal(err)
	}
	sClosed := sh(t, c, closed.EnvID, "echo closed > /g").Info.StateID
	// The test engine retains no closed env's states: a pin keeps it.
	if err := c.Pin(ctx, sClosed); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Unpin(context.Background(), sClosed) })
	if err := c.CloseEnv(ctx, closed.EnvID); err != nil {
		t.Fatal(err)
	}
	bare := reset(t, c, arbor.ResetParams{Image: "busybox"})
	sBare := sh(t, c, bare, "echo bare > /g").Info.StateID
	bare2 := reset(t, c, arbor.ResetParams{Image: "busybox"})
	sBare2 := sh(t, c, bare2, "echo bare2 > /g").Info.StateID

	refused := []struct {
		name, env, state string
		want             []string // in the message
	}{
		{"another task's open env", a, sB, []string{`task "left"`, `task "right"`, sB, a}},
		{"another task's closed env", a, sClosed, []string{`task "left"`, `task "right"`}},
		{"an env without a task", a, sBare, []string{`task "left"`, `image "busybox" (no task)`}},
		{"a task's env, into an env without one", bare, sA, []string{`task "left"`, `image "busybox" (no task)`}},
	}
	for _, tt := range refused {
		t.Run("refused/"+tt.name, func(t *testing.T) {
			before := sh(t, c, tt.env, "cat /f /g 2>&1; true").Obs.Stdout
			_, err := c.Rollback(ctx, tt.env, tt.state)
			if !errors.Is(err, arbor.ErrBadRequest) {
				t.Fatalf("rollback of %s to %s: %v, want bad_request", tt.env, tt.state, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q does not name %s", err, w)
				}
			}
			if after := sh(t, c, tt.env, "cat /f /g 2>&1; true").Obs.Stdout; string(after) != string(before) {
				t.Errorf("the refused rollback changed the env: %q, was %q", after, before)
			}
		})
	}
	allowed := []struct {
		name, env, state, want string
	}{
		{"its branch child's state", a, sChild, "left\nchild"},
		{"a sibling's state of the same task", a, sSibling, "left\nsibling"},
		{"its own state", a, sA, "left\na2"},
		{"another env without a task, same image", bare, sBare2, "bare2"},
	}
	for _, tt := range allowed {
		t.Run("allowed/"+tt.name, func(t *testing.T) {
			if _, err := c.Rollback(ctx, tt.env, tt.state); err != nil {
				t.Fatalf("rollback of %s to %s: %v", tt.env, tt.state, err)
			}
			got := strings.TrimSpace(string(sh(t, c, tt.env, "cat /f /g 2>/dev/null; true").Obs.Stdout))
			if got != tt.want {
				t.Errorf("after the rollback: %q, want %q", got, tt.want)
			}
		})
	}
}
