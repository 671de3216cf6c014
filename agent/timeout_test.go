package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/arbor-env/arbor/agent"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
)

// TestTaskCommandTimeout: a bash or fork_try call that gives no timeout_s
// gets its task's command_timeout (the coordinator's rule, as a protocol
// step does), not a default of the tools'; one that gives timeout_s gets
// that.
func TestTaskCommandTimeout(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	ctx := context.Background()
	pool, err := envpool.NewPool(ctx, engine, []envpool.Task{{Name: "quick", Image: "busybox", CommandTimeout: time.Second}},
		envpool.PoolOptions{Warm: -1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close(context.Background()) })
	co, err := coordinator.New(coordinator.Options{Engine: engine, Tasks: coordinator.FromEnvpool(pool), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(co.Close)
	tools, err := agent.New(agent.Options{Coordinator: co, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := co.Reset(ctx, coordinator.ResetRequest{Task: "quick"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { co.CloseEnv(context.Background(), r.Env.ID) })
	s, err := tools.Attach(r.Env.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	// 5 s of sleep against the task's 1 s.
	b, err := s.Bash(ctx, agent.BashArgs{Cmd: "sleep 5; echo done"})
	if err != nil {
		t.Fatal(err)
	}
	if !b.TimedOut || b.Stdout != "" {
		t.Errorf("bash without timeout_s in a task of command_timeout 1 s: timed out %v, stdout %q; want cut", b.TimedOut, b.Stdout)
	}
	f, err := s.ForkTry(ctx, agent.ForkTryArgs{Cmd: "sleep 5; echo done"})
	if err != nil {
		t.Fatal(err)
	}
	if !f.TimedOut {
		t.Errorf("fork_try without timeout_s in a task of command_timeout 1 s: not timed out (stdout %q)", f.Stdout)
	}
	// The agent's own timeout wins over the task's.
	b, err = s.Bash(ctx, agent.BashArgs{Cmd: "sleep 2; echo done", TimeoutS: 30})
	if err != nil {
		t.Fatal(err)
	}
	if b.TimedOut || b.Stdout != "done\n" {
		t.Errorf("bash with timeout_s 30: timed out %v, stdout %q; want done", b.TimedOut, b.Stdout)
	}
}
