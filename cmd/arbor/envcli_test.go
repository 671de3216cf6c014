package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
)

// cliRun is one run of the arbor binary: its output and exit status.
type cliRun struct {
	stdout, stderr string
	code           int
}

// runArbor runs the real arbor binary with args, env added to the test's
// environment and dir as its working directory ("" for the test's own).
func runArbor(t *testing.T, ctx context.Context, env []string, dir string, args ...string) cliRun {
	t.Helper()
	cmd := exec.CommandContext(ctx, servetest.Bin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliRun{stdout: out.String(), stderr: errb.String()}
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("arbor %v: %v", args, err)
	}
	return r
}

// TestEnvCLIConventions runs the real arbor serve and drives it with the
// real `arbor env` as a script would (issue 37, the CLI): the server
// address from $ARBOR_URL, an explicit --server winning over it; exit
// statuses a script can test (a command's own status passed through, 124
// for a command past its --timeout, 64 for a usage error, 65 for a request
// the server refused, 69 for a server that cannot be reached); step's
// --timeout as the command's timeout and --request-timeout the request's,
// and no server flags in `arbor env --help`; promote, discard, prepare,
// pin, unpin, release and tasks, each with --output json and a text form;
// and a SIGTERM that says at once what the stop waits for.
func TestEnvCLIConventions(t *testing.T) {
	servetest.RequireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var (
		mu    sync.Mutex
		lines []string
	)
	srv := servetest.Start(t, servetest.Options{
		Args: []string{"--warm", "1", "--env-idle-ttl", "-1s", "--inspector", "off"},
		OnLine: func(l string) {
			mu.Lock()
			lines = append(lines, l)
			mu.Unlock()
		}})
	c := srv.Dial(t, ctx, 3*time.Minute)
	defer c.Close()
	wsURL := "ws://" + srv.Addr + "/v1/ws"
	env := func(args ...string) cliRun { // arbor env ARGS against srv
		t.Helper()
		return runArbor(t, ctx, nil, "", append([]string{"env", "--server", srv.Addr}, args...)...)
	}
	jsonOut := func(t *testing.T, r cliRun, v any) {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
		}
		if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
			t.Fatalf("not JSON: %v: %q", err, r.stdout)
		}
	}

	t.Run("ARBOR_URL", func(t *testing.T) {
		r := runArbor(t, ctx, []string{"ARBOR_URL=" + wsURL, "ARBOR_SERVER="}, "", "env", "reset", "--task", "hello", "--json")
		var res arbor.ResetResult
		jsonOut(t, r, &res)
		found := false
		for _, e := range mustEnvs(t, ctx, c) {
			found = found || e.EnvID == res.EnvID
		}
		if !found {
			t.Errorf("the env %q that arbor env reset made with ARBOR_URL=%s is not on that server", res.EnvID, wsURL)
		}
		// An explicit --server wins over ARBOR_URL.
		r = runArbor(t, ctx, []string{"ARBOR_URL=ws://127.0.0.1:1/v1/ws"}, "", "env", "--server", srv.Addr, "close", res.EnvID)
		if r.code != 0 {
			t.Errorf("--server with a dead ARBOR_URL: exit %d: %s", r.code, r.stderr)
		}
	})

	// An image's episode: no max_turns to run into.
	var res arbor.ResetResult
	jsonOut(t, env("reset", "--image", "busybox", "--json"), &res)
	id := res.EnvID

	t.Run("exit status", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			args []string
			env  []string
			want int
		}{
			{"command exits 0", []string{"step", id, "true"}, nil, 0},
			{"command exits 3", []string{"step", id, "--", "echo out; exit 3"}, nil, 3},
			{"command exits 3, json", []string{"step", id, "-o", "json", "--", "exit 3"}, nil, 3},
			{"command past --timeout", []string{"step", id, "--timeout", "1s", "--", "sleep 30"}, nil, exitTimedOut},
			{"usage: missing argument", []string{"rollback", id}, nil, exitUsage},
			{"usage: unknown flag", []string{"ls", "--no-such-flag"}, nil, exitUsage},
			{"usage: bad --output", []string{"ls", "-o", "yaml"}, nil, exitUsage},
			{"refused: unknown env", []string{"step", "nosuchenv", "true"}, nil, exitRefused},
			{"refused: unknown state", []string{"rollback", id, "s-nosuch"}, nil, exitRefused},
		} {
			t.Run(tt.name, func(t *testing.T) {
				if r := env(tt.args...); r.code != tt.want {
					t.Errorf("arbor env %v: exit %d, want %d\n%s%s", tt.args, r.code, tt.want, r.stdout, r.stderr)
				}
			})
		}
		r := runArbor(t, ctx, nil, "", "env", "--server", "127.0.0.1:1", "ls")
		if r.code != exitUnavailable {
			t.Errorf("arbor env ls on a server that is not there: exit %d, want %d: %s", r.code, exitUnavailable, r.stderr)
		}
		r = runArbor(t, ctx, nil, "", "env", "--server", wsURL+"-nosuchpath", "ls")
		if r.code != exitRefused {
			t.Errorf("arbor env ls on a wrong path of the server (HTTP 404): exit %d, want %d: %s", r.code, exitRefused, r.stderr)
		}
		var s arbor.StepResult
		r = env("step", id, "-o", "json", "--", "exit 3")
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil || s.Obs.ExitCode != 3 {
			t.Errorf("step -o json of a command that exits 3: %v %q", err, r.stdout)
		}
	})

	t.Run("flags", func(t *testing.T) {
		r := runArbor(t, ctx, nil, "", "env", "--help")
		for _, server := range []string{"--state-dir", "--backend", "--pool-size", "--criu"} {
			if strings.Contains(r.stdout, server) {
				t.Errorf("arbor env --help shows the server flag %s:\n%s", server, r.stdout)
			}
		}
		for _, want := range []string{"--server", "--token", "--output", "--request-timeout", "--log-level", "ARBOR_URL", "Exit status"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("arbor env --help does not mention %s:\n%s", want, r.stdout)
			}
		}
		// --timeout is the command's; past it the command is killed.
		var s arbor.StepResult
		jsonOut(t, env("step", id, "--timeout", "2s", "-o", "json", "--", "sleep 1; echo slept"), &s)
		if s.Obs.TimedOut || strings.TrimSpace(string(s.Obs.Stdout)) != "slept" {
			t.Errorf("a 1 s command under --timeout 2s: %+v", s.Obs)
		}
		r = env("step", id, "--cmd-timeout", "1s", "-o", "json", "--", "sleep 30")
		if r.code != exitTimedOut || json.Unmarshal([]byte(r.stdout), &s) != nil || !s.Obs.TimedOut {
			t.Errorf("--cmd-timeout (deprecated) 1s of sleep 30: exit %d, %q", r.code, r.stdout)
		}
		// A long wait says so on stderr (--progress always: the test's
		// stderr is no terminal, where auto would); never says nothing.
		if r := env("--progress", "always", "step", id, "--", "sleep 4; echo late"); r.code != 0 || !strings.Contains(r.stderr, "waiting for the server's answer") || strings.TrimSpace(r.stdout) == "" {
			t.Errorf("--progress always on a 4 s step: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if r := env("--progress", "never", "step", id, "--", "sleep 4"); r.code != 0 || strings.Contains(r.stderr, "waiting") {
			t.Errorf("--progress never on a 4 s step: exit %d, stderr %q", r.code, r.stderr)
		}
		if r := env("--progress", "sometimes", "step", id, "--", "true"); r.code != exitUsage {
			t.Errorf("--progress sometimes: exit %d, want %d (usage)", r.code, exitUsage)
		}
		// --request-timeout bounds the wait for the answer.
		if r := env("--request-timeout", "1s", "step", id, "--", "sleep 5"); r.code != exitUnavailable || !strings.Contains(r.stderr, "--request-timeout") {
			t.Errorf("--request-timeout 1s on a 5 s command: exit %d: %s", r.code, r.stderr)
		}
	})

	t.Run("subcommands", func(t *testing.T) {
		// A branch promoted: its origin holds its file.
		kids, err := c.Branch(ctx, arbor.BranchParams{EnvID: id, N: 2})
		if err != nil {
			t.Fatal(err)
		}
		step(t, ctx, c, kids.EnvIDs[0], "echo promoted > /p")
		var pr arbor.PromoteResult
		jsonOut(t, env("promote", kids.EnvIDs[0], "-o", "json"), &pr)
		if pr.EnvID != id || pr.StateID == "" {
			t.Errorf("promote: %+v, want env %s", pr, id)
		}
		if s, err := c.Step(ctx, id, arbor.Bash("cat /p", 0)); err != nil || strings.TrimSpace(string(s.Obs.Stdout)) != "promoted" {
			t.Errorf("the origin after promote: %v %+v", err, s)
		}
		var ids map[string][]string
		jsonOut(t, env("discard", kids.EnvIDs[1], "-o", "json"), &ids)
		if len(ids["discarded"]) != 1 {
			t.Errorf("discard -o json: %v", ids)
		}
		for _, e := range mustEnvs(t, ctx, c) {
			if e.EnvID == kids.EnvIDs[0] || e.EnvID == kids.EnvIDs[1] {
				t.Errorf("%s still open after promote or discard", e.EnvID)
			}
		}
		st, err := c.States(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		head := st.Head
		jsonOut(t, env("pin", head, "-o", "json"), &ids)
		if len(ids["pinned"]) != 1 || ids["pinned"][0] != head {
			t.Errorf("pin -o json: %v", ids)
		}
		if r := env("unpin", head); r.code != 0 || !strings.Contains(r.stdout, "unpinned "+head) {
			t.Errorf("unpin: exit %d: %s%s", r.code, r.stdout, r.stderr)
		}
		var prep arbor.PrepareResult
		jsonOut(t, env("prepare", head, "-n", "1", "--wait", "-o", "json"), &prep)
		if prep.Prepared[head] < 1 {
			t.Errorf("prepare -o json: %+v", prep)
		}
		if r := env("prepare", head); r.code != 0 || !strings.Contains(r.stdout, head+" prepared") {
			t.Errorf("prepare: exit %d: %s%s", r.code, r.stdout, r.stderr)
		}
		var tasks arbor.TasksResult
		jsonOut(t, env("tasks", "-o", "json"), &tasks)
		if len(tasks.Tasks) != 1 || tasks.Tasks[0].Name != "hello" {
			t.Errorf("tasks -o json: %+v", tasks)
		}
		if r := env("tasks"); r.code != 0 || !strings.Contains(r.stdout, "hello") || !strings.Contains(r.stdout, "busybox") {
			t.Errorf("tasks: exit %d: %s%s", r.code, r.stdout, r.stderr)
		}
		// release last: a state of a closed env, released, is gone.
		kids, err = c.Branch(ctx, arbor.BranchParams{EnvID: id, N: 1})
		if err != nil {
			t.Fatal(err)
		}
		step(t, ctx, c, kids.EnvIDs[0], "echo x > /x")
		ks, err := c.States(ctx, kids.EnvIDs[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := c.CloseEnv(ctx, kids.EnvIDs[0]); err != nil {
			t.Fatal(err)
		}
		jsonOut(t, env("release", ks.Head, "-o", "json"), &ids)
		if len(ids["released"]) != 1 {
			t.Errorf("release -o json: %v", ids)
		}
		if r := env("release", "s-nosuch"); r.code != exitRefused {
			t.Errorf("release of an unknown state: exit %d, want %d: %s", r.code, exitRefused, r.stderr)
		}
	})

	t.Run("serve says what it loads and waits for", func(t *testing.T) {
		// Before anything heavy, serve names its task folder (or warns it
		// has none): a listen address in use stops it right after.
		tasks := filepath.Join(t.TempDir(), "mytasks")
		if err := os.MkdirAll(tasks, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tasks, "hello.yaml"), defaultTask, 0o644); err != nil {
			t.Fatal(err)
		}
		r := runArbor(t, ctx, nil, t.TempDir(), "--state-dir", t.TempDir(), "serve", "--listen", srv.Addr, "--tasks", tasks)
		if r.code == 0 || !strings.Contains(r.stderr, "loaded tasks") || !strings.Contains(r.stderr, "dir="+tasks) || !strings.Contains(r.stderr, "tasks=1") {
			t.Errorf("serve --tasks %s: exit %d: want a line naming the folder and tasks=1:\n%s", tasks, r.code, r.stderr)
		}
		r = runArbor(t, ctx, []string{"ARBOR_TASKS="}, t.TempDir(), "--state-dir", t.TempDir(), "serve", "--listen", srv.Addr)
		if !strings.Contains(r.stderr, "level=WARN") || !strings.Contains(r.stderr, "only the built-in hello task") {
			t.Errorf("serve without --tasks, away from any ./tasks: want a warning:\n%s", r.stderr)
		}

		open := len(mustEnvs(t, ctx, c))
		if err := srv.Stop(2 * time.Minute); err != nil {
			t.Fatalf("arbor serve after SIGTERM: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		var notice string
		for _, l := range lines {
			if strings.HasPrefix(l, "arbor: stopping:") {
				notice = l
			}
		}
		if !strings.Contains(notice, "requests in flight (up to --grace") || !strings.Contains(notice, "closing "+itoa(open)+" envs") {
			t.Errorf("after SIGTERM with %d envs open, the notice is %q:\n%s", open, notice, strings.Join(lines[max(0, len(lines)-20):], "\n"))
		}
	})
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func mustEnvs(t *testing.T, ctx context.Context, c *arbor.Client) []arbor.EnvInfo {
	t.Helper()
	envs, err := c.Envs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return envs
}
