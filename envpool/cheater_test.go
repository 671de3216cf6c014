package envpool_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	buildRecipeImages(t, r, tasks, "../images")
	// Files changed after this stamp (by ctime, which no agent can set
	// back) are the ones the host search below reads: the images'
	// own files, hundreds of MiB per snapshot, cannot hold hidden content.
	stamp := filepath.Join(t.TempDir(), "stamp")
	if err := os.WriteFile(stamp, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // ctimes after the stamp's differ from it
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
	// The tasks' cheaters run side by side (each in its own envs); the
	// group ends when the last one has.
	t.Run("cheaters", func(t *testing.T) {
		for _, task := range tasks {
			lo, _ := task.Range()
			t.Run(task.Name, func(t *testing.T) {
				t.Parallel()
				rs, err := p.Reset(ctx, envpool.ResetRequest{Task: task.Name})
				if err != nil {
					t.Fatal(err)
				}
				defer e.CloseEnv(ctx, rs.Env)
				score(t, "untouched", rs.Env, task, lo)
				before := rs.Env.Head()
				// Nothing hidden is there to find (before the cheater
				// replaces grep): one pass over the tree for all the
				// task's markers.
				if ms := hiddenMarkers(t, task); len(ms) > 0 {
					if res := exec1(t, rs.Env, "find / -xdev -type f -exec grep -lF"+grepArgs(ms)+" {} + 2>/dev/null | head -3"); len(bytes.TrimSpace(res.Stdout)) > 0 {
						t.Errorf("hidden content %q found in the agent's sandbox: %s", ms, res.Stdout)
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
	})
	// The hidden files never reached a snapshot or a process image: the
	// whole pool and the engine's state directory, by content.
	// One pass over the host's copies for every task's markers; a hit
	// is then told apart by marker.
	owner := map[string]string{}
	var markers []string
	for _, task := range tasks {
		for _, m := range hiddenMarkers(t, task) {
			if _, ok := owner[m]; !ok {
				markers = append(markers, m)
			}
			owner[m] += " " + task.Name
		}
	}
	if len(markers) == 0 {
		t.Fatal("no shipped task has a hidden line to search for: the search below would prove nothing")
	}
	searched := time.Now()
	defer func() { t.Logf("host search took %s", time.Since(searched).Round(time.Millisecond)) }()
	// The snapshots of states (every checkpoint's files) and the
	// engine's directory (process images, the manifest): every file
	// written since the stamp.
	for _, dir := range []string{r.Snap.Path(strings.TrimSuffix(branch.SnapshotPrefix, "/")), filepath.Join(r.Dir, "engine")} {
		list, err := exec.Command("find", dir, "-type", "f", "-cnewer", stamp, "-print0").Output()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			// A snapshot the GC deleted while find walked it: what is
			// gone holds nothing any more.
			t.Logf("find under %s: %v: %s", dir, err, lastLine(ee.Stderr))
		case err != nil:
			t.Fatalf("find under %s: %v", dir, err)
		}
		files := strings.Count(string(list), "\x00")
		if files == 0 {
			t.Fatalf("no file under %s changed during the test: the search would prove nothing", dir)
		}
		args := []string{"-0r", "grep", "-ohF", "--binary-files=text"}
		for _, m := range markers {
			args = append(args, "-e", m)
		}
		cmd := exec.Command("xargs", args...)
		cmd.Stdin = bytes.NewReader(list)
		cmd.Env = append(os.Environ(), "LC_ALL=C") // bytes, not characters: the same matches, faster
		out, _ := cmd.Output()
		t.Logf("searched %d files under %s", files, dir)
		for _, hit := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if hit != "" {
				t.Errorf("task%s: hidden content %q found on the host under %s", owner[hit], hit, dir)
			}
		}
	}
	t.Run("solutions", func(t *testing.T) {
		for _, task := range tasks {
			_, hi := task.Range()
			t.Run(task.Name, func(t *testing.T) {
				t.Parallel()
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
	})
}

// hiddenMarkers are lines of a task's hidden files (inline and in its
// hidden directory) that appear nowhere else (none of its other files, no
// solution writes them).
func hiddenMarkers(t *testing.T, task envpool.Task) []string {
	bodies := slices.Collect(maps.Values(task.HiddenFiles))
	if task.Hidden != "" {
		err := filepath.WalkDir(task.Hidden, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(p)
			bodies = append(bodies, string(b))
			return err
		})
		if err != nil {
			t.Fatalf("task %s: hidden directory: %v", task.Name, err)
		}
	}
	var ms []string
	for _, body := range bodies {
		for _, l := range strings.Split(body, "\n") {
			l = strings.TrimSpace(l)
			if len(l) >= 24 && !strings.ContainsAny(l, `'\`) {
				ms = append(ms, l)
				break
			}
		}
	}
	slices.Sort(ms)
	return slices.Compact(ms)
}

// grepArgs spells markers as grep's -e options for sh.
func grepArgs(markers []string) string {
	var b strings.Builder
	for _, m := range markers {
		b.WriteString(" -e '" + m + "'")
	}
	return b.String()
}

// buildRecipeImages builds the images the tasks name that have a recipe
// in dir (images/NAME.yaml), as the server does on first use
// (docs/images.md, "Recipes").
func buildRecipeImages(t *testing.T, r *branchtest.Rig, tasks []envpool.Task, dir string) {
	t.Helper()
	done := map[string]bool{}
	for _, task := range tasks {
		p := filepath.Join(dir, task.Image+".yaml")
		if done[task.Image] {
			continue
		}
		done[task.Image] = true
		if _, err := os.Stat(p); err != nil {
			continue
		}
		start := time.Now()
		if _, err := r.Images.BuildRecipe(context.Background(), task.Image, p, nil); err != nil {
			t.Fatalf("build image %s: %v", task.Image, err)
		}
		t.Logf("image %s built from %s in %s", task.Image, p, time.Since(start).Round(time.Millisecond))
	}
}

// lastLine is the last non-empty line of b.
func lastLine(b []byte) string {
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	return l[len(l)-1]
}
