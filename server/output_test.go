package server_test

import (
	"context"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/server"
)

// TestStepWithHugeMaxOutput: a step whose max_output is far beyond what
// the sandbox's memory could hold gets its output capped at the
// server-wide ceiling, and the env goes on working. Init once buffered the
// output inside the sandbox and was OOM-killed: that step and every later
// one answered sandbox_failed.
func TestStepWithHugeMaxOutput(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	ctx := context.Background()
	c := dial(t, addr, nil)
	reset, err := c.Reset(ctx, arbor.ResetParams{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	env := reset.EnvID
	act := arbor.Bash("head -c 300000000 /dev/zero", 60*time.Second)
	act.MaxOutput = 1 << 40
	r, err := c.Step(ctx, env, act)
	if err != nil {
		t.Fatalf("step: %v", err)
	}
	if r.Obs.ExitCode != 0 || !r.Obs.Truncated || len(r.Obs.Stdout) < sandbox.MaxOutputCeiling || len(r.Obs.Stdout) > sandbox.MaxOutputCeiling+100 {
		t.Errorf("step: exit %d, truncated %v, %d bytes of stdout; want exit 0, truncated at %d", r.Obs.ExitCode, r.Obs.Truncated, len(r.Obs.Stdout), sandbox.MaxOutputCeiling)
	}
	if got := string(sh(t, c, env, "echo still here").Obs.Stdout); got != "still here\n" {
		t.Errorf("next step: stdout %q", got)
	}
}
