package server_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch/branchtest"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
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
