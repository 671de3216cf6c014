package server_test

import (
	"context"
	"errors"
	"testing"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server"
)

// TestDiscardOfAReset: as docs/protocol.md says, promote of an env reset
// made is bad_request (it has no origin), while discard takes it and ends
// it as close does: the env is gone, and a pinned state of it stays
// branchable.
func TestDiscardOfAReset(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	ctx := context.Background()
	c := dial(t, addr, nil)
	r, err := c.Reset(ctx, arbor.ResetParams{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	t.Cleanup(func() { c.CloseEnv(context.Background(), env) })
	sid := sh(t, c, env, "echo 2 > /work/n").Info.StateID
	if err := c.Pin(ctx, sid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Unpin(context.Background(), sid) })
	if _, err := c.Promote(ctx, env); !errors.Is(err, arbor.ErrBadRequest) {
		t.Errorf("promote of a reset env: %v, want bad_request", err)
	}
	if err := c.Discard(ctx, env); err != nil {
		t.Fatalf("discard of a reset env: %v", err)
	}
	if _, err := c.Step(ctx, env, arbor.Bash("true", 0)); !errors.Is(err, arbor.ErrUnknownEnv) {
		t.Errorf("step after discard: %v, want unknown_env", err)
	}
	br, err := c.Branch(ctx, arbor.BranchParams{StateID: sid, N: 1})
	if err != nil {
		t.Fatalf("branch of the discarded env's pinned state: %v", err)
	}
	t.Cleanup(func() { c.CloseEnv(context.Background(), br.EnvIDs[0]) })
	if got := sh(t, c, br.EnvIDs[0], "cat /work/n").Obs.Stdout; string(got) != "2\n" {
		t.Errorf("the discarded env's state: n = %q, want 2", got)
	}
	if br.Task != "count" {
		t.Errorf("child of the discarded env's state: task %q, want count", br.Task)
	}
}
