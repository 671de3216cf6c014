package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server"
)

// keyedStep is a bash step with a request key.
func keyedStep(ctx context.Context, c *arbor.Client, env, key, cmd string) (*arbor.StepResult, error) {
	return c.StepKeyed(ctx, env, key, arbor.Bash(cmd, 20*time.Second))
}

// TestStepKeys: a retry of a keyed step (the same env and key, from any
// connection, also while the first still runs) answers the recorded
// result without running the command again (docs/protocol.md,
// "Idempotent steps"); branch reports the task and turn its children
// continue.
func TestStepKeys(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	ctx := context.Background()
	c := dial(t, addr, nil)
	hello, err := c.Hello(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if !hello.Capabilities.StepKeys {
		t.Error("hello does not announce step_keys")
	}
	reset, err := c.Reset(ctx, arbor.ResetParams{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	env := reset.EnvID
	defer c.CloseEnv(ctx, env)
	const cmd = "echo x >> /tmp/log; wc -l < /tmp/log"
	first, err := keyedStep(ctx, c, env, "k1", cmd)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(first.Obs.Stdout)) != "1" || first.Info.Replayed {
		t.Fatalf("first run: %q replayed=%v", first.Obs.Stdout, first.Info.Replayed)
	}
	c2 := dial(t, addr, nil)
	again, err := keyedStep(ctx, c2, env, "k1", cmd)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Info.Replayed || again.Info.StateID != first.Info.StateID || again.Info.Turn != first.Info.Turn || again.Obs.Stdout != first.Obs.Stdout {
		t.Fatalf("retry: %+v, first %+v", again.Info, first.Info)
	}
	if r := sh(t, c, env, "wc -l < /tmp/log"); strings.TrimSpace(string(r.Obs.Stdout)) != "1" {
		t.Fatalf("the retried command ran again: %q lines", r.Obs.Stdout)
	}
	if _, err := keyedStep(ctx, c, env, "k1", "echo other"); err == nil || !strings.Contains(err.Error(), "bad_request") {
		t.Fatalf("same key, other action: %v", err)
	}
	if _, err := keyedStep(ctx, c, env, strings.Repeat("k", 200), "ls"); err == nil || !strings.Contains(err.Error(), "invalid_params") {
		t.Fatalf("a 200-byte key: %v", err)
	}
	// A batch item with a key the env recorded is replayed too.
	var batch arbor.StepBatchResult
	if err := c.Call(ctx, "step_batch", map[string]any{"items": []map[string]any{
		{"env_id": env, "key": "k1", "action": arbor.Bash(cmd, 20*time.Second)},
		{"env_id": env, "key": "k2", "action": arbor.Bash(cmd, 20*time.Second)},
	}}, &batch); err != nil {
		t.Fatal(err)
	}
	if r := batch.Results[0].Result; r == nil || !r.Info.Replayed || r.Info.StateID != first.Info.StateID {
		t.Fatalf("batch item with k1: %+v", batch.Results[0])
	}
	if r := batch.Results[1].Result; r == nil || r.Info.Replayed || strings.TrimSpace(string(r.Obs.Stdout)) != "2" {
		t.Fatalf("batch item with k2: %+v", batch.Results[1])
	}

	// The connection drops while a keyed step runs; the retry from
	// another connection waits for it and gets its result.
	c3, err := arbor.Dial(ctx, addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	slow := "sleep 1; echo y >> /tmp/slow; wc -l < /tmp/slow"
	go keyedStep(ctx, c3, env, "k3", slow)
	time.Sleep(300 * time.Millisecond)
	c3.Close()
	r, err := keyedStep(ctx, c, env, "k3", slow)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Info.Replayed || strings.TrimSpace(string(r.Obs.Stdout)) != "1" {
		t.Fatalf("retry after the drop: replayed=%v stdout %q", r.Info.Replayed, r.Obs.Stdout)
	}
	if r := sh(t, c, env, "wc -l < /tmp/slow"); strings.TrimSpace(string(r.Obs.Stdout)) != "1" {
		t.Fatalf("the step ran twice: %q lines", r.Obs.Stdout)
	}

	// branch names the task and the turn its children continue.
	b, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseEnv(ctx, b.EnvIDs[0])
	turn := r.Info.Turn + 1 // the sh after it
	if b.Task != "count" || b.Turn != turn {
		t.Errorf("branch: task %q turn %d, want count %d", b.Task, b.Turn, turn)
	}
	bs, err := c.Branch(ctx, arbor.BranchParams{StateID: first.Info.StateID, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseEnv(ctx, bs.EnvIDs[0])
	if bs.Task != "count" || bs.Turn != first.Info.Turn {
		t.Errorf("branch of a state: task %q turn %d, want count %d", bs.Task, bs.Turn, first.Info.Turn)
	}
}
