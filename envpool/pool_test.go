package envpool_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

func quiet() *slog.Logger { return branchtest.Logger() }

// newEngine opens an engine on a fresh loop-mounted btrfs pool, or skips
// when the host lacks root, CRIU or btrfs.
func newEngine(tb testing.TB) (*branch.Engine, *image.Store) {
	tb.Helper()
	r := branchtest.ForTest(tb, branchtest.Options{})
	return r.Engine, r.Images
}

var helloTask = envpool.Task{
	Name:  "hello",
	Image: "busybox",
	Env:   map[string]string{"GREETING": "it's here"},
	Setup: []string{
		"mkdir -p /work/hello && cd /work/hello",
		"echo prepared > /work/hello/README",
		"sleep 1000 >/dev/null 2>&1 </dev/null &", // a background process must survive into every reset
	},
	Instruction: "write $GREETING to /work/hello/greeting.txt",
	Verifier:    `touch /work/verifier-was-here; cd /; test "$(cat /work/hello/greeting.txt 2>/dev/null)" = "$GREETING"`,
	MaxTurns:    5,
}

var scoreTask = envpool.Task{
	Name: "score", Image: "busybox", Outputs: []string{"/work"},
	Verifier: `n=$(cat /work/n 2>/dev/null || echo 0); echo "scoring"; echo "0.$n"; exit 1`,
}

func run(tb testing.TB, e *branch.Engine, env *branch.Env, cmd string) string {
	tb.Helper()
	r, err := e.Exec(context.Background(), env, cmd, sandbox.ExecOptions{Timeout: 20 * time.Second})
	if err != nil {
		tb.Fatalf("exec %q: %v", cmd, err)
	}
	if r.ExitCode != 0 {
		tb.Fatalf("exec %q: exit %d: %s", cmd, r.ExitCode, r.Stderr)
	}
	return strings.TrimSpace(string(r.Stdout))
}

func TestPoolResetEvaluate(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	var progress bytes.Buffer
	var pmu sync.Mutex
	start := time.Now()
	p, err := envpool.NewPool(ctx, e, []envpool.Task{helloTask, scoreTask},
		envpool.PoolOptions{Warm: 2, Logger: quiet(), Progress: lockedWriter{&pmu, &progress}})
	if err != nil {
		t.Fatal(err)
	}
	prepared := time.Since(start)
	defer p.Close(ctx)
	if err := p.WaitWarm(ctx); err != nil {
		t.Fatal(err)
	}
	filled := time.Since(start)
	for _, ts := range p.Stats().Tasks {
		t.Logf("task %s prepared in %s; ready %d", ts.Name, ts.Prepared, ts.Ready)
	}
	t.Logf("NewPool %s, warm pool full after %s", prepared, filled)
	pmu.Lock()
	out := progress.String()
	pmu.Unlock()
	if !strings.Contains(out, "preparing tasks") || !strings.Contains(out, "filling warm pool") || !strings.Contains(out, "4/4") {
		t.Errorf("progress output lacks the phases: %q", out)
	}

	for _, id := range []string{p.Stats().Tasks[0].State} {
		if id == "" {
			t.Fatal("no post-setup state")
		}
	}
	t0 := time.Now()
	r, err := p.Reset(ctx, envpool.ResetRequest{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reset from the warm pool: %s", time.Since(t0))
	env := r.Env
	if r.Instruction != helloTask.Instruction || r.Task.Name != "hello" || r.StateID != p.Stats().Tasks[0].State {
		t.Errorf("reset = %+v", r)
	}
	if env.Turn() != 0 {
		t.Errorf("an episode starts at turn %d, want 0 (setup is not a turn)", env.Turn())
	}
	if env.Origin != "" {
		t.Errorf("handed-out env has origin %q (the task's template)", env.Origin)
	}
	if tk, ok := p.TaskOfState(r.StateID); !ok || tk.Name != "hello" {
		t.Errorf("TaskOfState(post-setup state) = %v %v, want hello", tk, ok)
	}
	if got := run(t, e, env, `echo "$(pwd) $GREETING $(cat README)"; cat /proc/[0-9]*/cmdline | tr '\0' ' ' | grep -q '[s]leep 1000' && echo bg`); got != "/work/hello it's here prepared\nbg" {
		t.Errorf("post-setup state not restored: %q", got)
	}

	ev, err := p.Evaluate(ctx, env, r.Task, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Reward != 0 || ev.Details["exit_code"] != 1 {
		t.Errorf("unsolved task: %+v", ev)
	}
	run(t, e, env, `echo "$GREETING" > greeting.txt`)
	ev, err = p.Evaluate(ctx, env, r.Task, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("evaluate: %+v", ev.Details)
	if ev.Reward != 1 || ev.Details["reward_from"] != "exit_status" {
		t.Errorf("solved task: %+v", ev)
	}
	if got := run(t, e, env, `pwd; ls /work/verifier-was-here 2>/dev/null || echo untouched`); got != "/work/hello\nuntouched" {
		t.Errorf("the verifier touched the env: %q", got)
	}

	// A number on the verifier's last line is the reward, whatever its status.
	rs, err := p.Reset(ctx, envpool.ResetRequest{Task: "score", Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, e, rs.Env, `echo $ARBOR_SEED`); got != "42" {
		t.Errorf("ARBOR_SEED = %q", got)
	}
	if rs.StateID == p.Stats().Tasks[1].State {
		t.Errorf("a seeded reset kept the unseeded state id %s", rs.StateID)
	}
	// The seed is a command of the env's lineage, run through the engine
	// (which counts it): its state is one turn after the task's.
	if _, err := e.WaitCheckpoint(ctx, rs.Env); err != nil {
		t.Fatal(err)
	}
	seeded, err := e.State(rs.StateID)
	if err != nil {
		t.Fatal(err)
	}
	if post, err := e.State(p.Stats().Tasks[1].State); err != nil || seeded.Turn != post.Turn+1 {
		t.Errorf("seeded state at turn %d, task's state at %d (%v); want one turn after", seeded.Turn, post.Turn, err)
	}
	run(t, e, rs.Env, `echo 7 > /work/n`)
	ev, err = p.Evaluate(ctx, rs.Env, rs.Task, 42)
	if err != nil || ev.Reward != 0.7 || ev.Details["reward_from"] != "stdout" {
		t.Errorf("numeric verifier: %+v, %v", ev, err)
	}

	// Failures of the machinery are errors, not rewards.
	if err := e.CloseEnv(ctx, rs.Env); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Evaluate(ctx, rs.Env, rs.Task, 0); !errors.Is(err, state.ErrClosed) {
		t.Errorf("evaluate of a closed env: %v, want state.ErrClosed", err)
	}
	if _, err := p.Evaluate(ctx, env, envpool.Task{Image: "busybox"}, 0); !errors.Is(err, state.ErrNoVerifier) {
		t.Errorf("evaluate without verifier: %v", err)
	}
	if _, err := p.Reset(ctx, envpool.ResetRequest{Task: "nope"}); !errors.Is(err, state.ErrUnknownTask) || !strings.Contains(err.Error(), "hello") {
		t.Errorf("unknown task: %v", err)
	}
	if _, err := p.Reset(ctx, envpool.ResetRequest{Task: "hello", Image: "debian"}); !errors.Is(err, state.ErrInvalid) {
		t.Errorf("task with another image: %v", err)
	}
	if _, err := p.Reset(ctx, envpool.ResetRequest{}); !errors.Is(err, state.ErrInvalid) {
		t.Errorf("empty reset: %v", err)
	}

	// Fresh env from an image.
	t0 = time.Now()
	fr, err := p.Reset(ctx, envpool.ResetRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reset of a fresh image env: %s", time.Since(t0))
	if fr.StateID == "" || fr.Task.Image != "busybox" || fr.Instruction != "" {
		t.Errorf("image reset: %+v", fr)
	}
	if got := run(t, e, fr.Env, `ls /work/hello 2>/dev/null; echo ok`); got != "ok" {
		t.Errorf("fresh env sees task files: %q", got)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func TestPoolSetupFailureNamesCommand(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	bad := envpool.Task{Name: "bad", Image: "busybox", Setup: []string{"echo one", "echo oops >&2; false", "echo never"}}
	_, err := envpool.NewPool(ctx, e, []envpool.Task{bad}, envpool.PoolOptions{Logger: quiet()})
	if !errors.Is(err, envpool.ErrSetup) {
		t.Fatalf("err = %v, want ErrSetup", err)
	}
	for _, want := range []string{"task bad", "setup command 2/3", "false", "status 1", "oops"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if n := len(e.Envs()); n != 0 {
		t.Errorf("%d envs left behind by a failed pool", n)
	}
}

// TestPoolTaskCaps: a task's caps: reach every env handed out for it (they
// are restored from the task's states, whose isolation records carry the
// set), and a task asking for more than Docker's set does not start on a
// server without --allow-extra-caps.
func TestPoolTaskCaps(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	few := envpool.Task{Name: "few", Image: "busybox", Caps: []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}}
	p, err := envpool.NewPool(ctx, e, []envpool.Task{few}, envpool.PoolOptions{Warm: -1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	want, _ := sandbox.ParseCaps(few.Caps)
	for i := 0; i < 2; i++ {
		r, err := p.Reset(ctx, envpool.ResetRequest{Task: "few"})
		if err != nil {
			t.Fatal(err)
		}
		got := run(t, e, r.Env, "grep -E '^Cap(Eff|Bnd)' /proc/1/status /proc/self/status | awk '{print $2}' | sort -u")
		if got != want.String() {
			t.Errorf("reset %d: caps %q, want %s", i, got, want)
		}
	}
	more := envpool.Task{Name: "more", Image: "busybox", Caps: append(append([]string{}, sandbox.DefaultCaps...), "CAP_SYS_PTRACE")}
	_, err = envpool.NewPool(ctx, e, []envpool.Task{more}, envpool.PoolOptions{Warm: -1, Logger: quiet()})
	if !errors.Is(err, sandbox.ErrIsolation) || !strings.Contains(err.Error(), "--allow-extra-caps") {
		t.Fatalf("task asking for CAP_SYS_PTRACE: %v, want an ErrIsolation naming --allow-extra-caps", err)
	}
}
