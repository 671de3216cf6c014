package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/state"
)

func dial(t testing.TB, addr string, o *arbor.Options) *arbor.Client {
	t.Helper()
	c, err := arbor.Dial(context.Background(), addr, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sh runs a bash step and fails the test unless it exits 0.
func sh(t testing.TB, c *arbor.Client, env, cmd string) *arbor.StepResult {
	t.Helper()
	r, err := c.Step(context.Background(), env, arbor.Bash(cmd, 20*time.Second))
	if err != nil {
		t.Fatalf("step %q in %s: %v", cmd, env, err)
	}
	if r.Obs.ExitCode != 0 {
		t.Fatalf("step %q in %s: exit %d, stderr %q", cmd, env, r.Obs.ExitCode, r.Obs.Stderr)
	}
	return r
}

func TestEpisode(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	ctx := context.Background()
	c := dial(t, addr, nil)
	hello, err := c.Hello(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(hello.Capabilities.Tasks) != 1 || hello.Capabilities.Tasks[0] != "count" {
		t.Errorf("hello tasks: %v", hello.Capabilities.Tasks)
	}
	if hello.Capabilities.EnvIdleTTLS != 0 {
		t.Errorf("hello: env_idle_ttl_s %v without an idle TTL, want 0", hello.Capabilities.EnvIdleTTLS)
	}
	reset, err := c.Reset(ctx, arbor.ResetParams{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	env := reset.EnvID
	if reset.Obs.Instruction != testTask.Instruction || string(reset.Obs.Stdout) != testTask.Instruction || reset.Info.StateID == "" || reset.Info.Turn != 0 {
		t.Fatalf("reset: %+v", reset)
	}
	s1 := sh(t, c, env, "pwd; echo 1 > /work/n; export K=parent; bg() { echo fn; }")
	if got := strings.TrimSpace(string(s1.Obs.Stdout)); got != "/work" || s1.Obs.Cwd != "/work" {
		t.Errorf("setup's cd did not carry over: stdout %q cwd %q", got, s1.Obs.Cwd)
	}
	if s1.Info.Turn != 1 || s1.Info.Checkpoint != "full" || s1.Info.StateID == reset.Info.StateID || s1.Truncated || s1.Reward != 0 {
		t.Errorf("step info: %+v reward %v truncated %v", s1.Info, s1.Reward, s1.Truncated)
	}
	// A state id can be branched from the moment the step returned it,
	// while its checkpoint may still run.
	early, err := c.Branch(ctx, arbor.BranchParams{StateID: s1.Info.StateID, N: 1})
	if err != nil {
		t.Fatalf("branch from a fresh state id: %v", err)
	}
	if got := strings.TrimSpace(string(sh(t, c, early.EnvIDs[0], "cat /work/n").Obs.Stdout)); got != "1" {
		t.Errorf("early branch: %q", got)
	}
	c.CloseEnv(ctx, early.EnvIDs[0])
	// write_file and read_file carry any bytes, to paths with spaces.
	content := append([]byte("it's a \\c %s\n\x00\xff\xfe"), bytes.Repeat([]byte{0, 1, 2, 'a', '\'', 0x80}, 20000)...)
	w, err := c.Step(ctx, env, arbor.WriteFile("dir with space/it's.bin", content))
	if err != nil || w.Obs.ExitCode != 0 {
		t.Fatalf("write_file: %v %+v", err, w)
	}
	rd, err := c.Step(ctx, env, arbor.Action{Tool: "read_file", Path: "/work/dir with space/it's.bin", MaxOutput: 1 << 20})
	if err != nil || rd.Obs.ExitCode != 0 {
		t.Fatalf("read_file: %v %+v", err, rd)
	}
	if !bytes.Equal([]byte(rd.Obs.Stdout), content) {
		t.Fatalf("read_file returned %d bytes, want the %d written", len(rd.Obs.Stdout), len(content))
	}
	missing, err := c.Step(ctx, env, arbor.ReadFile("/nope"))
	if err != nil || missing.Obs.ExitCode == 0 || len(missing.Obs.Stderr) == 0 {
		t.Errorf("read_file of a missing file: %v %+v", err, missing.Obs)
	}
	before := sh(t, c, env, "echo 2 > /work/n")

	// branch(4): four children at the parent's state.
	br, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(br.EnvIDs) != 4 || br.Errors != nil || br.StateID != before.Info.StateID {
		t.Fatalf("branch: %+v (parent head %s)", br, before.Info.StateID)
	}
	t.Logf("branch(4) took %.0f ms", br.TookS*1000)
	var wg sync.WaitGroup
	for i, child := range br.EnvIDs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := sh(t, c, child, fmt.Sprintf(`echo "$K $(bg) $(cat /work/n)"; echo %d > /work/n; export K=child%d`, 10+i, i))
			if got := strings.TrimSpace(string(r.Obs.Stdout)); got != "parent fn 2" {
				t.Errorf("child %d did not start at the parent's state: %q", i, got)
			}
		}()
	}
	wg.Wait()
	for i, child := range br.EnvIDs {
		r := sh(t, c, child, `echo "$K $(cat /work/n)"`)
		if got, want := strings.TrimSpace(string(r.Obs.Stdout)), fmt.Sprintf("child%d %d", i, 10+i); got != want {
			t.Errorf("child %d: %q, want %q", i, got, want)
		}
	}
	if got := strings.TrimSpace(string(sh(t, c, env, `echo "$K $(cat /work/n)"`).Obs.Stdout)); got != "parent 2" {
		t.Errorf("parent sees its children's changes: %q", got)
	}

	// rollback (method) takes child 0 back to the parent's first step.
	info, err := c.Rollback(ctx, br.EnvIDs[0], s1.Info.StateID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Restored != s1.Info.StateID || info.Turn != 1 {
		t.Errorf("rollback info: %+v", info)
	}
	if got := strings.TrimSpace(string(sh(t, c, br.EnvIDs[0], `echo "$K $(cat /work/n)"`).Obs.Stdout)); got != "parent 1" {
		t.Errorf("after rollback: %q", got)
	}
	// The rollback tool: the agent of child 1 returns to the branch point.
	rb, err := c.Step(ctx, br.EnvIDs[1], arbor.RollbackTo(br.StateID))
	if err != nil {
		t.Fatal(err)
	}
	if rb.Info.Restored != br.StateID || !strings.Contains(string(rb.Obs.Stdout), br.StateID) || rb.Obs.Cwd != "/work" {
		t.Errorf("rollback tool: %+v", rb)
	}
	if got := strings.TrimSpace(string(sh(t, c, br.EnvIDs[1], `cat /work/n`).Obs.Stdout)); got != "2" {
		t.Errorf("after the rollback tool: %q", got)
	}
	// A state the agent never saw is its mistake, not an error.
	bad, err := c.Step(ctx, br.EnvIDs[1], arbor.RollbackTo("s000000000000"))
	if err != nil || bad.Obs.ExitCode == 0 {
		t.Errorf("rollback tool to an unknown state: %v %+v", err, bad)
	}
	if _, err := c.Rollback(ctx, env, "nope"); !errors.Is(err, arbor.ErrUnknownState) {
		t.Errorf("rollback method to an unknown state: %v", err)
	}

	// evaluate runs the verifier on a fork: child 3 (n=13) passes, the
	// parent (n=2) does not, and neither is changed by it.
	for _, tt := range []struct {
		env  string
		want float64
	}{{env, 0}, {br.EnvIDs[3], 1}} {
		ev, err := c.Evaluate(ctx, tt.env)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Reward != tt.want {
			t.Errorf("evaluate %s: reward %v, want %v (%v)", tt.env, ev.Reward, tt.want, ev.Details)
		}
	}
	st, err := c.States(ctx, br.EnvIDs[2])
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.States); n < 3 || st.States[n-1].StateID != st.Head {
		t.Errorf("states: %+v", st)
	}
	// Accounting: the first state has a process image of its own, and
	// the lineage counts at least what its states own.
	var own int64
	for _, s := range st.States {
		own += s.Bytes
	}
	if st.States[0].Bytes <= 0 || st.Bytes < own {
		t.Errorf("states bytes: lineage %d, states %+v; want the first state's image and the lineage at least their sum %d", st.Bytes, st.States, own)
	}
	envs, err := c.Envs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(envs) < 5 {
		t.Errorf("envs lists %d, want at least 5", len(envs))
	}
	// promote child 2 into the parent; discard child 3.
	pr, err := c.Promote(ctx, br.EnvIDs[2])
	if err != nil {
		t.Fatal(err)
	}
	if pr.EnvID != env {
		t.Errorf("promote went to %s, want %s", pr.EnvID, env)
	}
	if got := strings.TrimSpace(string(sh(t, c, env, `echo "$K $(cat /work/n)"`).Obs.Stdout)); got != "child2 12" {
		t.Errorf("parent after promote: %q", got)
	}
	if err := c.Discard(ctx, br.EnvIDs[3]); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{br.EnvIDs[2], br.EnvIDs[3]} {
		if _, err := c.Step(ctx, id, arbor.Bash("true", 0)); !errors.Is(err, arbor.ErrUnknownEnv) {
			t.Errorf("step in promoted/discarded %s: %v", id, err)
		}
	}
	for _, id := range []string{env, br.EnvIDs[0], br.EnvIDs[1]} {
		if err := c.CloseEnv(ctx, id); err != nil {
			t.Error(err)
		}
	}
	if _, err := c.Step(ctx, env, arbor.Bash("true", 0)); !errors.Is(err, arbor.ErrUnknownEnv) {
		t.Errorf("step after close: %v", err)
	}
}

// TestConcurrentEnvs steps 64 envs at once over one pipelined connection.
func TestConcurrentEnvs(t *testing.T) {
	// Files-only checkpoints keep 64 envs cheap, and exercise the
	// coordinator's non-full path.
	_, addr := newServerWith(t, server.Options{}, coordinator.Options{Classify: classifyAs(state.FS)})
	ctx := context.Background()
	c := dial(t, addr, nil)
	const n = 64
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = r.EnvID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, id := range ids {
			c.CloseEnv(context.Background(), id)
		}
	})
	start := time.Now()
	const steps = 2
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range steps {
				r, err := c.Step(ctx, id, arbor.Bash(fmt.Sprintf("echo %d-%d >> /tmp/log; cat /tmp/log | wc -l", i, k), 0))
				if err != nil {
					t.Error(err)
					return
				}
				if got := strings.TrimSpace(string(r.Obs.Stdout)); got != fmt.Sprint(k+1) {
					t.Errorf("env %d step %d: %q", i, k, got)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d steps in %d envs: %.1f steps/s", n*steps, n, float64(n*steps)/time.Since(start).Seconds())

	// The same through step_batch: a notification per item, then all.
	items := make([]arbor.BatchItem, n)
	for i, id := range ids {
		items[i] = arbor.BatchItem{EnvID: id, Action: arbor.Bash("cat /tmp/log | wc -l", 0)}
	}
	var mu sync.Mutex
	seen := map[int]bool{}
	res, err := c.StepBatch(ctx, items, func(it arbor.BatchItemResult) {
		mu.Lock()
		seen[it.Index] = true
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != n || len(res.Results) != n {
		t.Fatalf("step_batch: %d notifications, %d results", len(seen), len(res.Results))
	}
	for i, r := range res.Results {
		if r.Error != nil || r.Index != i || r.EnvID != ids[i] || strings.TrimSpace(string(r.Result.Obs.Stdout)) != fmt.Sprint(steps) {
			t.Errorf("batch item %d: %+v", i, r)
			continue
		}
		if r.Result.Info.Checkpoint != "fs" {
			t.Errorf("batch item %d checkpoint %q, want fs", i, r.Result.Info.Checkpoint)
		}
	}
}

// TestDisconnectMidStep: a client that goes away during a step leaves the
// step to finish and the env usable, at a consistent state.
func TestDisconnectMidStep(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	ctx := context.Background()
	a := dial(t, addr, nil)
	r, err := a.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	done := make(chan error, 1)
	go func() {
		_, err := a.Step(ctx, env, arbor.Bash("sleep 1; echo finished > /tmp/mark; cd /tmp", 0))
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	a.Close()
	if err := <-done; !errors.Is(err, arbor.ErrClosed) {
		t.Errorf("step on a closed client: %v", err)
	}
	b := dial(t, addr, nil)
	// This step queues behind the abandoned one and sees all it did.
	s := sh(t, b, env, "cat /tmp/mark; pwd")
	if got := string(s.Obs.Stdout); got != "finished\n/tmp\n" || s.Info.Turn != 2 {
		t.Fatalf("after the disconnect: %q turn %d", got, s.Info.Turn)
	}
	// Its state, and the abandoned step's, can be branched.
	st, err := b.States(ctx, env)
	if err != nil || len(st.States) != 3 {
		t.Fatalf("states: %v %+v", err, st)
	}
	br, err := b.Branch(ctx, arbor.BranchParams{StateID: st.States[1].StateID, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(sh(t, b, br.EnvIDs[0], "cat /tmp/mark; pwd").Obs.Stdout); got != "finished\n/tmp\n" {
		t.Errorf("branch of the abandoned step's state: %q", got)
	}
	b.CloseEnv(ctx, br.EnvIDs[0])
	b.CloseEnv(ctx, env)
}

// TestIdleEnvClosed: over the websocket, an env nobody names for the
// coordinator's idle TTL is closed: envs stops listing it and a step on
// it answers unknown_env.
func TestIdleEnvClosed(t *testing.T) {
	_, addr := newServerWith(t, server.Options{MaxUnreadBytes: 32 << 20}, coordinator.Options{IdleTTL: 200 * time.Millisecond})
	ctx := context.Background()
	c := dial(t, addr, nil)
	// hello says what the TTL is (and the unread budget).
	hello, err := c.Hello(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if hello.Capabilities.EnvIdleTTLS != 0.2 || hello.Capabilities.MaxUnreadBytes != 32<<20 {
		t.Errorf("hello: env_idle_ttl_s %v max_unread_bytes %d, want 0.2 and %d", hello.Capabilities.EnvIdleTTLS, hello.Capabilities.MaxUnreadBytes, 32<<20)
	}
	r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	listed := func() bool {
		envs, err := c.Envs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range envs {
			if e.EnvID == r.EnvID {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(30 * time.Second)
	for listed() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if listed() {
		t.Fatal("env idle for 200 ms is still listed after 30 s")
	}
	if _, err := c.Step(ctx, r.EnvID, arbor.Bash("true", 0)); !errors.Is(err, arbor.ErrUnknownEnv) {
		t.Errorf("step on the idle-closed env: %v, want unknown_env", err)
	}
	if _, err := engine.Env(r.EnvID); !errors.Is(err, state.ErrUnknownEnv) {
		t.Errorf("the engine still has the idle env: %v", err)
	}
}
