package server_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/branch"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/state"
)

// TestTurnClassesThroughServer runs a suite of turn types through the real
// server with the inspector as the coordinator's classifier and
// verification mode on: each turn gets its expected class, and a restore
// of every skipped or partial checkpoint equals the live env.
func TestTurnClassesThroughServer(t *testing.T) {
	_, addr := newServerWith(t, server.Options{}, coordinator.Options{Classify: engine.Classify, VerifySkips: 1})
	ctx := context.Background()
	c := dial(t, addr, nil)
	reset, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := reset.EnvID
	defer c.CloseEnv(ctx, env)
	turns := []struct {
		name, cmd, want string
	}{
		{"read only", "ls /; cat /etc/passwd; grep root /etc/passwd; find /etc -name 'pass*'", "none"},
		{"failing test run with temp files", "(echo 'exit 1' > /tmp/t.sh; sh /tmp/t.sh; rm -f /tmp/t.sh) || true", "none"},
		{"file edit", "mkdir -p /work && echo v1 > /work/app.txt", "fs"},
		{"install into a directory", "mkdir -p /opt/pkg/bin && echo 'echo hi' > /opt/pkg/bin/tool && chmod +x /opt/pkg/bin/tool", "fs"},
		{"cd", "cd /work", "proc"},
		{"export", "export MODE=test", "proc"},
		{"function", "greet() { echo hi; }", "proc"},
		{"alias", "alias ll='ls -l'", "proc"},
		{"create then delete", "echo x > /work/tmp; rm /work/tmp", "none"},
		{"identical rewrite (a new mtime)", "echo v1 > /work/app.txt", "fs"},
		{"metadata only", "touch -d '2001-02-03 04:05:06' /work/app.txt", "fs"},
		{"shell opens a descriptor", "exec 3>>/work/app.txt", "proc"},
		// The file is open in the shell now: its image records the size,
		// so a change to it needs the processes too.
		{"a change to a file the shell holds", "echo more >> /work/app.txt", "full"},
	}
	for _, tt := range turns {
		r := sh(t, c, env, tt.cmd)
		if r.Info.Checkpoint != tt.want {
			t.Errorf("%s: checkpoint %q, want %q", tt.name, r.Info.Checkpoint, tt.want)
		}
		if len(r.Info.VerifyMisses) > 0 {
			t.Errorf("%s: verification misses: %v", tt.name, r.Info.VerifyMisses)
		}
	}
	// Starting a background server that also writes a log is full: the
	// classification may see only the new process at the end of the turn,
	// and the checkpoint grows to full when the log write shows up while it
	// settles, frozen. (Verification is skipped here: the writer keeps
	// writing between the checkpoint and the comparison.)
	r := sh(t, c, env, "(while :; do echo tick >> /work/log; sleep 0.05; done) >/dev/null 2>&1 &")
	if e, err := engine.Env(env); err == nil {
		engine.WaitCheckpoint(ctx, e)
	}
	if st, err := engine.State(r.Info.StateID); err != nil || st.Kind != "full" {
		t.Errorf("background server with a log: state %s kind %q (%v), want full", r.Info.StateID, st.Kind, err)
	}
	sh(t, c, env, "kill %1; wait")
	// A background process that keeps changing its memory: at least proc
	// on every turn, and every such state restores to the live env.
	sh(t, c, env, "(i=0; while :; do i=$((i+1)); done) >/dev/null 2>&1 &")
	for i := 0; i < 3; i++ {
		r := sh(t, c, env, "true")
		if r.Info.Checkpoint == "none" || r.Info.Checkpoint == "fs" {
			t.Errorf("turn %d with a live memory changer: checkpoint %q", i, r.Info.Checkpoint)
		}
		if len(r.Info.VerifyMisses) > 0 {
			t.Errorf("turn %d: verification misses: %v", i, r.Info.VerifyMisses)
		}
	}
}

// TestMetrics scrapes /metrics after a reset and a step: the histograms
// (the reset counted once, no evaluate), the counters by kind and the
// engine's accounting are there, with no env ids in labels.
func TestMetrics(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	ctx := context.Background()
	c := dial(t, addr, nil)
	reset, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseEnv(ctx, reset.EnvID)
	sh(t, c, reset.EnvID, "echo x > /f")
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"arbor_step_seconds_bucket", "arbor_checkpoints_total{kind=\"full\"}", "arbor_active_envs",
		"arbor_checkpoint_exposed_seconds_total", "arbor_image_hot_bytes", "arbor_states",
		"\narbor_reset_seconds_count 1\n", "\narbor_evaluate_seconds_count 0\n"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if strings.Contains(string(body), reset.EnvID) {
		t.Errorf("/metrics mentions an env id")
	}
}

// TestSampledVerification: with --verify-skips below 1, a sampled skip is
// verified in the background. The step answers without verify_misses, the
// next operation on the env runs after the verification, and a wrong skip
// (a classifier that calls every turn none) is counted in
// arbor_verify_total{result="miss"} and logged with the env and turn.
func TestSampledVerification(t *testing.T) {
	var logs lockedBuffer
	reg := prometheus.NewRegistry()
	alwaysNone := func(ctx context.Context, env *branch.Env, cmd string) (branch.Turn, error) {
		return branch.Turn{Kind: state.None}, nil
	}
	_, addr := newServerWith(t, server.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registry: reg},
		coordinator.Options{Classify: alwaysNone, VerifySkips: 0.999999})
	ctx := context.Background()
	c := dial(t, addr, nil)
	reset, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := reset.EnvID
	defer c.CloseEnv(ctx, env)
	r := sh(t, c, env, "export Z=1")
	if r.Info.Checkpoint != "none" || len(r.Info.VerifyMisses) != 0 {
		t.Errorf("step: checkpoint %q, verify_misses %v; want none and no misses in the answer (verified later)", r.Info.Checkpoint, r.Info.VerifyMisses)
	}
	sh(t, c, env, "true") // queued behind the verification
	if got := counterValue(t, reg, "arbor_verify_total", "miss"); got < 1 {
		t.Errorf("arbor_verify_total{result=miss} = %v after a wrong skip, want at least 1", got)
	}
	if l := logs.String(); !strings.Contains(l, "skipped checkpoint verification found a miss") || !strings.Contains(l, env) || !strings.Contains(l, "turn=1") {
		t.Errorf("no log line naming the miss, env %s and turn 1:\n%s", env, l)
	}
}

// counterValue reads one labelled counter from a registry.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// lockedBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestVerificationThatCannotRun: a verification whose check cannot run
// (here its deadline, InspectTimeout, passes before the restore starts,
// as when a file system stops answering) is reported in the step as
// "verification failed" and counted as result="error", not as a miss.
func TestVerificationThatCannotRun(t *testing.T) {
	reg := prometheus.NewRegistry()
	none := func(context.Context, *branch.Env, string) (branch.Turn, error) {
		return branch.Turn{Kind: state.None}, nil
	}
	_, addr := newServerWith(t, server.Options{Registry: reg},
		coordinator.Options{Classify: none, VerifySkips: 1, InspectTimeout: time.Nanosecond})
	ctx := context.Background()
	c := dial(t, addr, nil)
	reset, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseEnv(ctx, reset.EnvID)
	r := sh(t, c, reset.EnvID, "export Z=1")
	if len(r.Info.VerifyMisses) != 1 || !strings.HasPrefix(r.Info.VerifyMisses[0], "verification failed: ") {
		t.Errorf("verify_misses %q, want one \"verification failed: ...\"", r.Info.VerifyMisses)
	}
	if got := counterValue(t, reg, "arbor_verify_total", "error"); got != 1 {
		t.Errorf("arbor_verify_total{result=error} = %v, want 1", got)
	}
	if got := counterValue(t, reg, "arbor_verify_total", "miss"); got != 0 {
		t.Errorf("arbor_verify_total{result=miss} = %v, want 0", got)
	}
}
