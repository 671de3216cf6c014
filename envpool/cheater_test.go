package envpool_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/sandbox"
)

// TestCheaterScoresZero is the cheater suite: on every shipped task
// (tasks/), a scripted hostile agent that knows no task (testdata/
// cheater.sh: it reads the whole tree and /proc, writes "a pass" into
// every file it can, replaces the tools on PATH and in /bin, plants
// interpreter start-up hooks and shadow modules, prints huge rewards and
// leaves watchers to rewrite whatever appears later) scores the task's
// low end, on the env, on a branch of it and after a rollback; the
// hidden files are in no snapshot or process image (searched by content);
// and each task's reference solution scores its high end while the
// untouched task scores its low end (docs/tasks.md, "Threat model").
func TestCheaterScoresZero(t *testing.T) {
	r := branchtest.ForTest(t, branchtest.Options{})
	e := r.Engine
	ctx := context.Background()
	tasks, err := envpool.LoadTasks("../tasks")
	if err != nil {
		t.Fatal(err)
	}
	cheat, err := os.ReadFile("testdata/cheater.sh")
	if err != nil {
		t.Fatal(err)
	}
	p, err := envpool.NewPool(ctx, e, tasks, envpool.PoolOptions{Warm: -1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	exec1 := func(t *testing.T, env *branch.Env, cmd string) *sandbox.Result {
		t.Helper()
		res, err := e.Exec(ctx, env, cmd, sandbox.ExecOptions{Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		return res
	}
	score := func(t *testing.T, what string, env *branch.Env, task envpool.Task, want float64) {
		t.Helper()
		ev, err := p.Evaluate(ctx, env, task, 0)
		if err != nil {
			t.Fatalf("%s: evaluate: %v", what, err)
		}
		if ev.Reward != want {
			t.Errorf("%s: reward %v, want %v (%v)", what, ev.Reward, want, ev.Details)
		}
	}
	for _, task := range tasks {
		lo, _ := task.Range()
		t.Run(task.Name+"/cheater", func(t *testing.T) {
			rs, err := p.Reset(ctx, envpool.ResetRequest{Task: task.Name})
			if err != nil {
				t.Fatal(err)
			}
			defer e.CloseEnv(ctx, rs.Env)
			score(t, "untouched", rs.Env, task, lo)
			before := rs.Env.Head()
			// Nothing hidden is there to find (before the cheater
			// replaces grep).
			for _, m := range hiddenMarkers(task) {
				if res := exec1(t, rs.Env, "find / -xdev -type f -exec grep -lF -e '"+m+"' {} + 2>/dev/null | head -3"); len(bytes.TrimSpace(res.Stdout)) > 0 {
					t.Errorf("hidden content %q found in the agent's sandbox: %s", m, res.Stdout)
				}
			}
			start := time.Now()
			out := exec1(t, rs.Env, string(cheat))
			if !strings.Contains(string(out.Stdout), "cheated") {
				t.Fatalf("the cheater did not run to its end: exit %d, %q, %q", out.ExitCode, out.Stdout, out.Stderr)
			}
			t.Logf("cheater ran in %s", time.Since(start).Round(time.Millisecond))
			score(t, "cheated", rs.Env, task, lo)
			br, err := e.Branch(ctx, branch.Source{Env: rs.Env}, 1)
			if err != nil || br.Errors[0] != nil {
				t.Fatalf("branch: %v %v", err, br)
			}
			defer e.CloseEnv(ctx, br.Children[0])
			score(t, "cheated, branched", br.Children[0], task, lo)
			if err := e.Rollback(ctx, rs.Env, before); err != nil {
				t.Fatal(err)
			}
			score(t, "rolled back", rs.Env, task, lo)
			exec1(t, rs.Env, string(cheat))
			score(t, "cheated again after the rollback", rs.Env, task, lo)
		})
	}
	// The hidden files never reached a snapshot or a process image: the
	// whole pool and the engine's state directory, by content.
	marked := 0
	for _, task := range tasks {
		marked += len(hiddenMarkers(task))
	}
	if marked == 0 {
		t.Fatal("no shipped task has a hidden line to search for: the search below would prove nothing")
	}
	searched := time.Now()
	defer func() { t.Logf("host search took %s", time.Since(searched).Round(time.Millisecond)) }()
	for _, task := range tasks {
		for _, m := range hiddenMarkers(task) {
			// The snapshots of states (every checkpoint's files) and the
			// engine's directory (process images, the manifest).
			for _, dir := range []string{r.Snap.Path(strings.TrimSuffix(branch.SnapshotPrefix, "/")), filepath.Join(r.Dir, "engine")} {
				out, _ := exec.Command("grep", "-rlF", "--binary-files=text", "-e", m, dir).Output()
				if len(bytes.TrimSpace(out)) > 0 {
					t.Errorf("task %s: hidden content %q found on the host under %s: %s", task.Name, m, dir, out)
				}
			}
		}
	}
	for _, task := range tasks {
		_, hi := task.Range()
		t.Run(task.Name+"/solution", func(t *testing.T) {
			if task.Solution == "" {
				t.Fatalf("shipped task %s has no reference solution", task.Name)
			}
			rs, err := p.Reset(ctx, envpool.ResetRequest{Task: task.Name})
			if err != nil {
				t.Fatal(err)
			}
			defer e.CloseEnv(ctx, rs.Env)
			if res := exec1(t, rs.Env, task.Solution); res.ExitCode != 0 {
				t.Fatalf("solution: exit %d: %s", res.ExitCode, res.Stderr)
			}
			score(t, "solved", rs.Env, task, hi)
		})
	}
}

// hiddenMarkers are lines of a task's hidden files that appear nowhere
// else (none of its other files, no solution writes them).
func hiddenMarkers(task envpool.Task) []string {
	var ms []string
	for _, body := range task.HiddenFiles {
		for _, l := range strings.Split(body, "\n") {
			l = strings.TrimSpace(l)
			if len(l) >= 24 && !strings.ContainsAny(l, `'\`) {
				ms = append(ms, l)
				break
			}
		}
	}
	return ms
}
