package server_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// TestPrepare drives prepare over a websocket: hello lists it; bad params
// answer invalid_params and an unknown state unknown_state; a prepare
// with wait of a past state (not the env's head) answers once its copies
// are ready, and a branch from that state thaws them (the engine counts
// them taken) into children holding that state's files. The engine's
// over-budget error is the protocol's retryable over_budget.
func TestPrepare(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	ctx := context.Background()
	c := dial(t, addr, nil)
	hello, err := c.Hello(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(hello.Capabilities.Methods, protocol.MethodPrepare) {
		t.Errorf("hello: methods %v lack prepare", hello.Capabilities.Methods)
	}
	reset, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := reset.EnvID
	past := sh(t, c, env, "echo 1 > /tmp/f").Info.StateID
	sh(t, c, env, "echo 2 > /tmp/f") // the head moves on

	if _, err := c.Prepare(ctx, nil, 1, false); !errors.Is(err, arbor.ErrInvalidParams) {
		t.Errorf("prepare of no states: %v, want invalid_params", err)
	}
	if _, err := c.Prepare(ctx, []string{past}, protocol.MaxPrepareN+1, false); !errors.Is(err, arbor.ErrInvalidParams) {
		t.Errorf("prepare n=%d: %v, want invalid_params", protocol.MaxPrepareN+1, err)
	}
	if _, err := c.Prepare(ctx, []string{past}, 0, false); !errors.Is(err, arbor.ErrInvalidParams) {
		t.Errorf("prepare n=0: %v, want invalid_params", err)
	}
	if _, err := c.Prepare(ctx, []string{past, "s-nosuch"}, 1, false); !errors.Is(err, arbor.ErrUnknownState) {
		t.Errorf("prepare naming an unknown state: %v, want unknown_state", err)
	}

	before, err := engine.Usage()
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Prepare(ctx, []string{past}, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Prepared[past] != 2 || res.Ready[past] != 2 || len(res.Refused) != 0 {
		t.Fatalf("prepare(%s, 2, wait): %+v, want 2 prepared and ready", past, res)
	}
	br, err := c.Branch(ctx, arbor.BranchParams{StateID: past, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	after, err := engine.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if n := after.Prepare.Taken - before.Prepare.Taken; n != 2 {
		t.Errorf("branch(2) from the prepared state took %d prepared copies, want 2", n)
	}
	for i, id := range br.EnvIDs {
		if id == "" {
			t.Fatalf("child %d: %v", i, br.Errors[i])
		}
		if got := strings.TrimSpace(string(sh(t, c, id, "cat /tmp/f").Obs.Stdout)); got != "1" {
			t.Errorf("child %d of the prepared state: /tmp/f = %q, want 1", i, got)
		}
		if err := c.CloseEnv(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}

	pe := protocol.ErrorOf(fmt.Errorf("prepare: %w", state.ErrOverBudget))
	if !errors.Is(pe, arbor.ErrOverBudget) || !pe.Retryable || pe.Infra {
		t.Errorf("the engine's over-budget error answers %+v, want over_budget, retryable, not infra", pe)
	}
}
