package envpool_test

import (
	"context"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// agentProcs is a verifier that passes only when none of the agent's
// processes (its forgers, its background sleep) is left.
const agentProcs = `! ps -o args | grep -q -e '^forger' -e '^sleep 1000'`

// TestEvaluateCannotBeForged evaluates the unsolved hello task (the real
// tasks/hello.yaml) while the agent has planted forgers of status records
// and signals in its sandbox and defined shell functions and aliases named
// like the verifier's commands: the reward stays 0.0. Solved, it is 1.0.
func TestEvaluateCannotBeForged(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	hello, err := envpool.LoadTask("../tasks/hello.yaml")
	if err != nil {
		t.Fatal(err)
	}
	procs := envpool.Task{Name: "procs", Image: "busybox", Verifier: agentProcs}
	// The verifier gets the episode's seed and starts where setup ended.
	seeded := envpool.Task{Name: "seeded", Image: "busybox", Setup: []string{"mkdir -p /work/s && cd /work/s"},
		Verifier: `[ "$(pwd)" = /work/s ] && [ -z "$AGENT" ] && echo "0.$ARBOR_SEED"`}
	keeps := envpool.Task{Name: "keeps", Image: "busybox", Verifier: agentProcs, VerifierKeepsProcesses: true}
	p, err := envpool.NewPool(ctx, e, []envpool.Task{hello, procs, keeps, seeded}, envpool.PoolOptions{Warm: -1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)

	r, err := p.Reset(ctx, envpool.ResetRequest{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.Env
	// Every capability: they are killed on the fork before the verifier.
	plant(t, e, env, false)
	// Everything the verifier's commands could be made to mean in the
	// agent's shell.
	run(t, e, env, `test() { return 0; }; cat() { echo "$GREETING"; }; alias test=true; alias cat='echo "$GREETING"'; printf() { :; }; cd /; export GREETING=x`)
	// The forgers hold every capability (no hardening yet), so they may
	// add bytes to the agent's own output: check by exit status.
	run(t, e, env, `test 1 = 2`) // fails the test unless the function is in place
	for try := 0; try < 3; try++ {
		ev, err := p.Evaluate(ctx, env, r.Task, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("unsolved, try %d: %+v", try, ev.Details)
		if ev.Reward != 0 || ev.Details["exit_code"] != 1 {
			t.Errorf("unsolved hello, try %d: reward %v (%+v), want 0", try, ev.Reward, ev.Details)
		}
		// The trusted grader: a pristine copy of the post-setup state,
		// where only setup's shell ran.
		if ev.Details["grader"] != "trusted" || ev.Details["killed"].(int) != 1 {
			t.Errorf("try %d: grader %v killed %v processes, want the trusted one and setup's shell alone", try, ev.Details["grader"], ev.Details["killed"])
		}
	}
	// The forgers still run in the env itself: only the fork was cleared.
	run(t, e, env, `[ "$(ps -o args | grep -c '^forger')" = 3 ]`)
	run(t, e, env, `echo "hello, arbor" > /work/hello/greeting.txt`)
	ev, err := p.Evaluate(ctx, env, r.Task, 0)
	if err != nil || ev.Reward != 1 {
		t.Errorf("solved hello: reward %v (%+v), %v; want 1", ev.Reward, ev.Details, err)
	}

	rs, err := p.Reset(ctx, envpool.ResetRequest{Task: "seeded", Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, rs.Env, `cd /; export AGENT=1`)
	if ev, err := p.Evaluate(ctx, rs.Env, rs.Task, 7); err != nil || ev.Reward != 0.7 {
		t.Errorf("seeded task: reward %v (%+v), %v; want 0.7", ev.Reward, ev.Details, err)
	}

	// The agent's processes are gone when the verifier runs, unless the
	// task keeps them.
	for _, tt := range []struct {
		task string
		want float64
	}{{"procs", 1}, {"keeps", 0}} {
		r, err := p.Reset(ctx, envpool.ResetRequest{Task: tt.task})
		if err != nil {
			t.Fatal(err)
		}
		// Docker's capabilities: with every capability, forgers that stay
		// next to the verifier can wedge init's fork of it through
		// /proc/1/fd (docs/sandbox.md, "Limits that remain").
		plant(t, e, r.Env, true)
		ev, err := p.Evaluate(ctx, r.Env, r.Task, 0)
		if err != nil || ev.Reward != tt.want {
			t.Errorf("task %s: reward %v (%+v), %v; want %v", tt.task, ev.Reward, ev.Details, err, tt.want)
		}
	}
}

// TestRestoredPtyStaysExclusive: in a sandbox restored from a checkpoint
// (a reset), a process without CAP_SYS_ADMIN still cannot open the
// shell's terminal: the exclusive mode survives CRIU.
func TestRestoredPtyStaysExclusive(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	p, err := envpool.NewPool(ctx, e, []envpool.Task{{Name: "t", Image: "busybox", Verifier: "true"}}, envpool.PoolOptions{Warm: -1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	r, err := p.Reset(ctx, envpool.ResetRequest{Task: "t"})
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.InstallForger(t, r.Env.Sandbox().Root())
	// The forger reports after its first round of opens.
	got := run(t, e, r.Env, `forger -docker-caps pty </dev/null >/dev/null 2>&1 & for i in $(seq 200); do [ -e /tmp/forger-pty ] && break; sleep 0.05; done; cat /tmp/forger-pty; cat /tmp/forger-pty-opened 2>/dev/null; true`)
	if !strings.HasPrefix(got, "rounds=") || !strings.Contains(got, " opened=0 live=[]") {
		t.Errorf("pty forger in a restored sandbox: %q, want a report and no opened terminal", got)
	}
}

// plant starts the forgers (status records, signals to init, pty opens)
// and a background job in env.
// With dockerCaps they hold only Docker's default capabilities, as in the
// hardened sandbox; else every capability.
func plant(t *testing.T, e *branch.Engine, env *branch.Env, dockerCaps bool) {
	t.Helper()
	sandboxtest.InstallForger(t, env.Sandbox().Root())
	flag := ""
	if dockerCaps {
		flag = "-docker-caps "
	}
	run(t, e, env, `for m in status signals pty; do forger `+flag+`$m </dev/null >/dev/null 2>&1 & done; sleep 1000 </dev/null >/dev/null 2>&1 &`)
	// Wait until all four have exec'd.
	run(t, e, env, `n=0; for i in $(seq 200); do n=$(ps -o args | grep -c -e '^forger' -e '^sleep 1000'); [ "$n" = 4 ] && break; sleep 0.05; done; [ "$n" = 4 ]`)
}
