package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/server"
)

// limitTasks are busybox tasks whose timeouts and turn limit a test can
// see within seconds.
var limitTasks = []envpool.Task{
	// timed: commands and the verifier are bounded by 1 s; 2 turns.
	{Name: "timed", Image: "busybox", CommandTimeout: time.Second, MaxTurns: 2,
		Verifier: "sleep 5; echo 1"},
	// slowverifier sets no command timeout: the pool's VerifierTimeout
	// bounds its verifier.
	{Name: "slowverifier", Image: "busybox", Verifier: "sleep 5; echo 1"},
}

// limitsServer serves limitTasks on the shared engine, with a 1 s
// verifier timeout and co's other coordinator options.
func limitsServer(t *testing.T, co coordinator.Options) *arbor.Client {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	p, err := envpool.NewPool(context.Background(), engine, limitTasks,
		envpool.PoolOptions{Warm: -1, VerifierTimeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	co.Tasks = coordinator.FromEnvpool(p)
	_, addr := newServerWith(t, server.Options{}, co)
	return dial(t, addr, nil)
}

func reset(t *testing.T, c *arbor.Client, p arbor.ResetParams) string {
	t.Helper()
	r, err := c.Reset(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseEnv(context.Background(), r.EnvID) })
	return r.EnvID
}

func step(t *testing.T, c *arbor.Client, env string, a arbor.Action) *arbor.StepResult {
	t.Helper()
	r, err := c.Step(context.Background(), env, a)
	if err != nil {
		t.Fatalf("step %+v in %s: %v", a, env, err)
	}
	return r
}

// TestTimeoutsReachTheClient: a bash step that outlives its timeout comes
// back timed_out, whichever bounds it (the action's timeout_s, the task's
// command_timeout, the server's MaxTimeout cap), and the shell lives on.
func TestTimeoutsReachTheClient(t *testing.T) {
	c := limitsServer(t, coordinator.Options{MaxTimeout: 2 * time.Second})
	tests := []struct {
		name  string
		reset arbor.ResetParams
		cmd   string
		tmo   time.Duration // the action's timeout_s (0: none)
	}{
		{"action timeout_s", arbor.ResetParams{Image: "busybox"}, "sleep 5", time.Second},
		{"task command_timeout", arbor.ResetParams{Task: "timed"}, "sleep 5", 0},
		{"server MaxTimeout caps timeout_s", arbor.ResetParams{Image: "busybox"}, "sleep 5", 20 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := reset(t, c, tt.reset)
			r := step(t, c, env, arbor.Bash("cd /tmp; X=kept; "+tt.cmd+"; echo finished", tt.tmo))
			if !r.Obs.TimedOut || strings.Contains(string(r.Obs.Stdout), "finished") {
				t.Fatalf("obs %+v: want timed_out and the command killed", r.Obs)
			}
			after := step(t, c, env, arbor.Bash(`echo "$X $(pwd)"`, 5*time.Second))
			if got := strings.TrimSpace(string(after.Obs.Stdout)); got != "kept /tmp" || after.Obs.TimedOut {
				t.Errorf("after the timeout the shell printed %q (timed_out %v), want \"kept /tmp\"", got, after.Obs.TimedOut)
			}
		})
	}
	// The action's timeout_s overrides the task's command_timeout.
	env := reset(t, c, arbor.ResetParams{Task: "timed"})
	if r := step(t, c, env, arbor.Bash("sleep 1.5; echo done", 2*time.Second)); r.Obs.TimedOut || strings.TrimSpace(string(r.Obs.Stdout)) != "done" {
		t.Errorf("timeout_s 2 s over command_timeout 1 s: obs %+v, want done", r.Obs)
	}
}

// TestTruncationReachesTheClient: output beyond max_output comes back cut
// to head and tail with obs.truncated set and the full sizes in info.
func TestTruncationReachesTheClient(t *testing.T) {
	c := limitsServer(t, coordinator.Options{})
	env := reset(t, c, arbor.ResetParams{Image: "busybox"})
	const limit, total = 1000, 100000
	a := arbor.Bash("head -c 100000 /dev/zero | tr '\\0' a; echo -n b; head -c 5000 /dev/zero | tr '\\0' e >&2", 10*time.Second)
	a.MaxOutput = limit
	r := step(t, c, env, a)
	out := string(r.Obs.Stdout)
	if !r.Obs.Truncated {
		t.Errorf("obs.truncated not set for %d bytes over max_output %d", total+1, limit)
	}
	if len(out) > limit+200 || !strings.HasPrefix(out, "aaa") || !strings.HasSuffix(out, "ab") {
		t.Errorf("stdout %d bytes (%.20q...%.20q), want about %d: the head and the tail", len(out), out, out[max(0, len(out)-20):], limit)
	}
	if r.Info.StdoutBytes != total+1 || r.Info.StderrBytes != 5000 {
		t.Errorf("info stdout_bytes %d stderr_bytes %d, want %d and 5000", r.Info.StdoutBytes, r.Info.StderrBytes, total+1)
	}
	if len(r.Obs.Stderr) > limit+200 {
		t.Errorf("stderr %d bytes, want it capped near %d too", len(r.Obs.Stderr), limit)
	}
	// Under the cap nothing is cut.
	small := step(t, c, env, arbor.Bash("echo small", 0))
	if small.Obs.Truncated || string(small.Obs.Stdout) != "small\n" || small.Info.StdoutBytes != 6 {
		t.Errorf("a short output: obs %+v stdout_bytes %d", small.Obs, small.Info.StdoutBytes)
	}
}

// TestMaxTurnsReachesTheClient: truncated is false before the task's
// max_turns and true on the turn that reaches it, with info's turn and
// max_turns (the turn after it is refused: TestMaxTurnsEndsTheEpisode).
func TestMaxTurnsReachesTheClient(t *testing.T) {
	c := limitsServer(t, coordinator.Options{})
	env := reset(t, c, arbor.ResetParams{Task: "timed"})
	for turn := 1; turn <= 2; turn++ {
		r := step(t, c, env, arbor.Bash("true", 0))
		if want := turn >= 2; r.Truncated != want || r.Info.Turn != turn || r.Info.MaxTurns != 2 {
			t.Errorf("turn %d: truncated %v (want %v), info turn %d max_turns %d", turn, r.Truncated, want, r.Info.Turn, r.Info.MaxTurns)
		}
	}
}

// TestVerifierTimeoutReachesTheClient: a verifier that outlives its
// timeout (the task's command_timeout, else the pool's VerifierTimeout)
// is a reward of 0 with details timed_out and reward_from "timeout"
// (docs/protocol.md, evaluate), not an error and not its late answer.
func TestVerifierTimeoutReachesTheClient(t *testing.T) {
	c := limitsServer(t, coordinator.Options{})
	for _, task := range []string{"timed", "slowverifier"} {
		t.Run(task, func(t *testing.T) {
			env := reset(t, c, arbor.ResetParams{Task: task})
			ev, err := c.Evaluate(context.Background(), env)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Reward != 0 || ev.Details["timed_out"] != true || ev.Details["reward_from"] != "timeout" {
				t.Errorf("evaluate: reward %v details %v; want 0, timed_out, reward_from timeout", ev.Reward, ev.Details)
			}
		})
	}
}

// TestTaskLimitsHoldInBranchedChildren: a child branched from a task's
// env, and an env rolled back, keep the task's command_timeout and
// max_turns (the turn count goes on from the branch point).
func TestTaskLimitsHoldInBranchedChildren(t *testing.T) {
	c := limitsServer(t, coordinator.Options{})
	ctx := context.Background()
	env := reset(t, c, arbor.ResetParams{Task: "timed"})
	first := step(t, c, env, arbor.Bash("echo 1 > /tmp/n", 0))
	br, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	child := br.EnvIDs[0]
	t.Cleanup(func() { c.CloseEnv(context.Background(), child) })
	r := step(t, c, child, arbor.Bash("sleep 5; echo finished", 0))
	if !r.Obs.TimedOut {
		t.Errorf("child: obs %+v, want the task's 1 s command_timeout to stop sleep 5", r.Obs)
	}
	if r.Info.Turn != 2 || !r.Truncated || r.Info.MaxTurns != 2 {
		t.Errorf("child's first step: turn %d truncated %v max_turns %d; want turn 2 of 2, truncated", r.Info.Turn, r.Truncated, r.Info.MaxTurns)
	}
	if _, err := c.Rollback(ctx, child, first.Info.StateID); err != nil {
		t.Fatal(err)
	}
	r = step(t, c, child, arbor.Bash("cat /tmp/n; sleep 5; echo finished", 0))
	if !r.Obs.TimedOut || strings.TrimSpace(string(r.Obs.Stdout)) != "1" {
		t.Errorf("after rollback: obs %+v, want the restored file and the task's timeout", r.Obs)
	}
	if r.Info.Turn != 2 || !r.Truncated {
		t.Errorf("after rollback to turn 1: turn %d truncated %v; want turn 2, truncated", r.Info.Turn, r.Truncated)
	}
}

// TestMaxTurnsEndsTheEpisode: at the task's max_turns the step is
// truncated and the next one refused (docs/protocol.md, "Episode end");
// reset's options.max_turns replaces the limit for the episode (0: none)
// and a bad one is invalid_params.
func TestMaxTurnsEndsTheEpisode(t *testing.T) {
	c := limitsServer(t, coordinator.Options{})
	ctx := context.Background()
	env := reset(t, c, arbor.ResetParams{Task: "timed"})
	bash := arbor.Action{Tool: "bash", Cmd: "echo hi"}
	if r := step(t, c, env, bash); r.Truncated {
		t.Fatalf("turn 1 of 2 truncated")
	}
	if r := step(t, c, env, bash); !r.Truncated {
		t.Fatalf("turn 2 of 2 not truncated")
	}
	if _, err := c.Step(ctx, env, bash); !errors.Is(err, arbor.ErrBadRequest) || !strings.Contains(err.Error(), "episode is over") {
		t.Errorf("turn 3 of 2: %v, want bad_request: the episode is over", err)
	}
	free := reset(t, c, arbor.ResetParams{Task: "timed", Options: map[string]any{"max_turns": 0}})
	for i := range 3 {
		if r := step(t, c, free, bash); r.Truncated || r.Info.MaxTurns != 0 {
			t.Errorf("turn %d without a limit: truncated %v, max_turns %d", i+1, r.Truncated, r.Info.MaxTurns)
		}
	}
	// A branch of one of its states, once it is closed, keeps its limit.
	last := step(t, c, free, bash)
	if err := c.Pin(ctx, last.Info.StateID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Unpin(context.Background(), last.Info.StateID) })
	if err := c.CloseEnv(ctx, free); err != nil {
		t.Fatal(err)
	}
	br, err := c.Branch(ctx, arbor.BranchParams{StateID: last.Info.StateID, N: 1})
	if err != nil || len(br.EnvIDs) != 1 {
		t.Fatalf("branch of the closed env's state: %+v, %v", br, err)
	}
	t.Cleanup(func() { c.CloseEnv(context.Background(), br.EnvIDs[0]) })
	for i := range 2 {
		if r := step(t, c, br.EnvIDs[0], bash); r.Truncated || r.Info.MaxTurns != 0 {
			t.Errorf("child turn %d: truncated %v, max_turns %d; want the parent's no limit", i+1, r.Truncated, r.Info.MaxTurns)
		}
	}
	three, err := c.Reset(ctx, arbor.ResetParams{Task: "timed", Options: map[string]any{"max_turns": 3}})
	if err != nil || three.Info.MaxTurns != 3 {
		t.Fatalf("reset with max_turns 3: %+v, %v", three, err)
	}
	c.CloseEnv(ctx, three.EnvID)
	for _, bad := range []any{-1, 1.5, "3"} {
		if _, err := c.Reset(ctx, arbor.ResetParams{Task: "timed", Options: map[string]any{"max_turns": bad}}); !errors.Is(err, arbor.ErrInvalidParams) {
			t.Errorf("reset with max_turns %v: %v, want invalid_params", bad, err)
		}
	}
}
