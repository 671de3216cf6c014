package envpool_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/sandbox"
)

// TestImportTerminalTasks imports the two terminal-task layouts
// (testdata/terminal: task.yaml + run-tests.sh + tests/ + solution.sh, and
// instruction.md + tests/test.sh + solution/solve.sh), writes them as task
// files with hidden tests, and runs them for real: untouched 0, the
// solution 1, the cheater 0, and the tests never in the agent's sandbox.
func TestImportTerminalTasks(t *testing.T) {
	out := t.TempDir()
	for _, name := range []string{"fib", "greet"} {
		tt, err := envpool.ImportTerminalTask(filepath.Join("testdata/terminal", name), "busybox", "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := envpool.WriteTerminalTask(tt, out); err != nil {
			t.Fatal(err)
		}
		if _, err := envpool.WriteTerminalTask(tt, out); err == nil || !strings.Contains(err.Error(), "exists") {
			t.Errorf("a second import of %s over the first: %v", name, err)
		}
	}
	tasks, err := envpool.LoadTasks(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 2 || tasks[0].Name != "fib" || tasks[0].Difficulty != "easy" || !strings.Contains(tasks[0].Instruction, "Fibonacci") ||
		tasks[0].Hidden == "" || tasks[0].HiddenPath != "/tests" || tasks[1].RewardFrom != envpool.RewardStdout {
		t.Fatalf("imported: %+v", tasks)
	}
	if _, err := envpool.ImportTerminalTask(t.TempDir(), "busybox", ""); err == nil {
		t.Error("a directory without tests/ imported")
	}

	e, _ := newEngine(t)
	ctx := context.Background()
	cheat, err := os.ReadFile("testdata/cheater.sh")
	if err != nil {
		t.Fatal(err)
	}
	p, err := envpool.NewPool(ctx, e, tasks, envpool.PoolOptions{Warm: -1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	markers := map[string]string{"fib": "fib-hidden-test-7f3a", "greet": "greet-hidden-test-91c2"}
	for _, task := range tasks {
		for _, tc := range []struct {
			what string
			cmd  string
			want float64
		}{{"untouched", "true", 0}, {"cheater", string(cheat), 0}, {"solution", task.Solution, 1}} {
			r, err := p.Reset(ctx, envpool.ResetRequest{Task: task.Name})
			if err != nil {
				t.Fatal(err)
			}
			if got := run(t, e, r.Env, "find / -xdev -type f -exec grep -l "+markers[task.Name]+" {} + 2>/dev/null | head -1; echo done"); got != "done" {
				t.Errorf("%s: the hidden test is in the agent's sandbox: %s", task.Name, got)
			}
			if _, err := e.Exec(ctx, r.Env, tc.cmd, sandbox.ExecOptions{Timeout: time.Minute}); err != nil {
				t.Fatal(err)
			}
			ev, err := p.Evaluate(ctx, r.Env, task, 0)
			if err != nil || ev.Reward != tc.want {
				t.Errorf("%s %s: reward %v (%v), %v; want %v", task.Name, tc.what, ev.Reward, ev.Details, err, tc.want)
			}
			e.CloseEnv(ctx, r.Env)
		}
	}
	// The CLI writes the same.
	bin := filepath.Join(t.TempDir(), "arbor")
	if b, err := exec.Command("go", "build", "-o", bin, "../cmd/arbor").CombinedOutput(); err != nil {
		t.Fatalf("build arbor: %v: %s", err, b)
	}
	cliOut := t.TempDir()
	if b, err := exec.Command(bin, "task", "import", "testdata/terminal/fib", "--image", "busybox", "--out", cliOut).CombinedOutput(); err != nil {
		t.Fatalf("arbor task import: %v: %s", err, b)
	}
	if _, err := envpool.LoadTask(filepath.Join(cliOut, "fib.yaml")); err != nil {
		t.Error(err)
	}
	if b, err := exec.Command(bin, "task", "import", "testdata/terminal/fib", "--out", cliOut).CombinedOutput(); err == nil || !strings.Contains(string(b), "--image") {
		t.Errorf("import without --image: %v: %s", err, b)
	}
}
