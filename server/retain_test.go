package server_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/branch/branchtest"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/state"
)

// TestReleasePinUnpin drives release, pin and unpin over a websocket (the
// shared engine keeps no retention): a state pinned the moment a step
// returned it outlives its env's close and the background GC, and still
// branches; the released head of an open env stays usable until the env
// closes; unknown ids answer unknown_state and change nothing; bad params
// answer invalid_params; once unpinned, the state goes. The GC's work
// shows in /metrics.
func TestReleasePinUnpin(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, addr := newServer(t, server.Options{Registry: reg})
	ctx := context.Background()
	c := dial(t, addr, nil)
	hello, err := c.Hello(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"release", "pin", "unpin"} {
		if !slices.Contains(hello.Capabilities.Methods, m) {
			t.Errorf("hello: methods %v lack %s", hello.Capabilities.Methods, m)
		}
	}
	reset, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := reset.EnvID
	s1 := sh(t, c, env, "echo 1 > /tmp/f").Info.StateID
	if err := c.Pin(ctx, s1); err != nil {
		t.Fatalf("pin of the state a step just returned: %v", err)
	}
	s2 := sh(t, c, env, "echo 2 > /tmp/f").Info.StateID
	if err := c.Release(ctx, s2, "s-nosuch"); !errors.Is(err, arbor.ErrUnknownState) {
		t.Errorf("release naming an unknown state: %v, want unknown_state", err)
	}
	if err := c.Unpin(ctx, s1, "s-nosuch"); !errors.Is(err, arbor.ErrUnknownState) {
		t.Errorf("unpin naming an unknown state: %v, want unknown_state", err)
	}
	if err := c.Release(ctx); !errors.Is(err, arbor.ErrInvalidParams) {
		t.Errorf("release of no states: %v, want invalid_params", err)
	}
	if err := c.Call(ctx, "pin", map[string]any{"state_ids": "s1"}, nil); !errors.Is(err, arbor.ErrInvalidParams) {
		t.Errorf("pin with a string for state_ids: %v, want invalid_params", err)
	}
	// The head of an open env, released: harmless while the env is open.
	if err := c.Release(ctx, s2); err != nil {
		t.Fatalf("release of an open env's head: %v", err)
	}
	if err := engine.GC(ctx); err != nil {
		t.Fatal(err)
	}
	child, err := c.Branch(ctx, arbor.BranchParams{StateID: s2, N: 1})
	if err != nil {
		t.Fatalf("branch from the released head of an open env: %v", err)
	}
	if got := strings.TrimSpace(string(sh(t, c, child.EnvIDs[0], "cat /tmp/f").Obs.Stdout)); got != "2" {
		t.Errorf("child of the released head: /tmp/f = %q, want 2", got)
	}
	if err := c.CloseEnv(ctx, child.EnvIDs[0]); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	// The background GC, nudged by the close, removes s2; s1 stays pinned.
	branchtest.WaitFor(t, "the closed env's unpinned states removed", func() bool {
		_, err := engine.State(s2)
		return errors.Is(err, state.ErrUnknownState)
	})
	if _, err := engine.State(s1); err != nil {
		t.Fatalf("pinned state after its env closed: %v", err)
	}
	pinned, err := c.Branch(ctx, arbor.BranchParams{StateID: s1, N: 1})
	if err != nil {
		t.Fatalf("branch from a pinned state of a closed env: %v", err)
	}
	if got := strings.TrimSpace(string(sh(t, c, pinned.EnvIDs[0], "cat /tmp/f").Obs.Stdout)); got != "1" {
		t.Errorf("child of the pinned state: /tmp/f = %q, want 1", got)
	}
	if err := c.CloseEnv(ctx, pinned.EnvIDs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Branch(ctx, arbor.BranchParams{StateID: s2, N: 1}); !errors.Is(err, arbor.ErrUnknownState) {
		t.Errorf("branch from a removed state: %v, want unknown_state", err)
	}
	if err := c.Unpin(ctx, s1); err != nil {
		t.Fatal(err)
	}
	branchtest.WaitFor(t, "the unpinned state removed", func() bool {
		_, err := engine.State(s1)
		return errors.Is(err, state.ErrUnknownState)
	})
	if err := c.Pin(ctx, s1); !errors.Is(err, arbor.ErrUnknownState) {
		t.Errorf("pin of a removed state: %v, want unknown_state", err)
	}
	for _, name := range []string{"arbor_gc_passes_total", "arbor_gc_deleted_states_total", "arbor_gc_deleted_artifacts_total"} {
		if got := metricValue(t, reg, name); got < 1 {
			t.Errorf("%s = %v after the GC removed states, want at least 1", name, got)
		}
	}
	if got := metricValue(t, reg, "arbor_gc_deleted_bytes_total"); got <= 0 {
		t.Errorf("arbor_gc_deleted_bytes_total = %v after process images were removed", got)
	}
	if got := metricValue(t, reg, "arbor_disk_used_bytes"); got <= 0 {
		t.Errorf("arbor_disk_used_bytes = %v, want the watched file systems' use", got)
	}
	for _, name := range []string{"arbor_gc_last_pass_seconds", "arbor_gc_errors_total", "arbor_artifacts", "arbor_artifact_bytes",
		"arbor_disk_free_bytes", "arbor_disk_size_bytes", "arbor_disk_pressure", "arbor_disk_refused_total", "arbor_gc_evicted_states_total"} {
		metricValue(t, reg, name) // present
	}
}

// metricValue is the value of the first series of a counter or gauge
// (fails the test when there is none).
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) == 0 {
			continue
		}
		m := mf.GetMetric()[0]
		if m.GetCounter() != nil {
			return m.GetCounter().GetValue()
		}
		return m.GetGauge().GetValue()
	}
	t.Fatalf("no %s metric", name)
	return 0
}
