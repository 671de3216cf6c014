package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
)

// TestEnvExport runs the real arbor serve, steps an env, branches it,
// rolls it back and goes on, then `arbor env export` writes each path as
// JSONL, one turn per line, with the actions and outputs the steps
// returned: by env id to a file, by state id to stdout. The server is
// stopped and started again on its state dir: the closed env's state,
// retained, exports the same turns. An id that is neither an env nor a
// state fails.
func TestEnvExport(t *testing.T) {
	servetest.RequireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir, addr := t.TempDir(), servetest.FreeAddr(t)
	srv, c := startServe(t, ctx, dir, addr)
	r, err := c.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	do := func(env, cmd string) *arbor.StepResult {
		t.Helper()
		s, err := c.Step(ctx, env, arbor.Bash(cmd, 0))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s1 := do(env, "echo one > f; echo made f")
	s2 := do(env, "echo two >> f; cat f; echo warn >&2")
	kids, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	child := kids.EnvIDs[0]
	s3 := do(child, "echo child >> f; wc -l < f")
	if _, err := c.Rollback(ctx, env, s1.Info.StateID); err != nil {
		t.Fatal(err)
	}
	s4 := do(env, "cat f; exit 7")

	arborCmd := func(args ...string) (string, string, error) {
		cmd := exec.CommandContext(ctx, servetest.Bin(t), append([]string{"env", "--server", addr}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	type line struct {
		Turn       int            `json:"turn"`
		StateID    string         `json:"state_id"`
		Checkpoint string         `json:"checkpoint"`
		Action     map[string]any `json:"action"`
		Obs        map[string]any `json:"obs"`
		StepS      float64        `json:"step_s"`
	}
	parse := func(what, jsonl string, want ...*arbor.StepResult) {
		t.Helper()
		lines := strings.Split(strings.TrimSuffix(jsonl, "\n"), "\n")
		if len(lines) != len(want) {
			t.Fatalf("%s: %d lines, want %d:\n%s", what, len(lines), len(want), jsonl)
		}
		for i, l := range lines {
			var x line
			if err := json.Unmarshal([]byte(l), &x); err != nil {
				t.Fatalf("%s: line %d: %v: %s", what, i, err, l)
			}
			w := want[i]
			if x.StateID != w.Info.StateID || x.Turn != w.Info.Turn || x.Checkpoint != w.Info.Checkpoint ||
				x.Obs["stdout"] != string(w.Obs.Stdout) || x.Obs["stderr"] != string(w.Obs.Stderr) ||
				x.Obs["exit_code"] != float64(w.Obs.ExitCode) || x.Action["tool"] != "bash" || x.StepS <= 0 {
				t.Errorf("%s: line %d: %s\nwant state %s turn %d stdout %q stderr %q exit %d", what, i, l,
					w.Info.StateID, w.Info.Turn, w.Obs.Stdout, w.Obs.Stderr, w.Obs.ExitCode)
			}
		}
	}
	file := filepath.Join(t.TempDir(), "env.jsonl")
	if _, stderr, err := arborCmd("export", env, "-o", file); err != nil {
		t.Fatalf("export %s: %v: %s", env, err, stderr)
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	parse("env rolled back", string(got), s1, s4)
	out, stderr, err := arborCmd("export", s3.Info.StateID)
	if err != nil {
		t.Fatalf("export %s: %v: %s", s3.Info.StateID, err, stderr)
	}
	parse("child's state", out, s1, s2, s3)
	if s4.Obs.ExitCode != 7 {
		t.Errorf("exit 7 came back as %d", s4.Obs.ExitCode)
	}

	// Stopped and started again: the closed envs' states are retained.
	if err := srv.Stop(time.Minute); err != nil {
		t.Fatal(err)
	}
	srv, _ = startServe(t, ctx, dir, addr)
	defer srv.Stop(time.Minute)
	out, stderr, err = arborCmd("export", s3.Info.StateID)
	if err != nil {
		t.Fatalf("export %s after a restart: %v: %s", s3.Info.StateID, err, stderr)
	}
	parse("child's state after a restart", out, s1, s2, s3)
	if _, stderr, err := arborCmd("export", "s-nosuch"); err == nil || !strings.Contains(stderr, "neither an open env nor a state") {
		t.Errorf("export of an unknown id: %v: %s", err, stderr)
	}
	if !slices.Contains([]string{"none", "fs", "proc", "full"}, s2.Info.Checkpoint) {
		t.Errorf("checkpoint kind %q", s2.Info.Checkpoint)
	}
}
