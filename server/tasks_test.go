package server_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/server"
)

// TestTasksDatasetsAndFinish: over the wire, tasks lists the tasks and a
// dataset and pages through its instances (a broken one listed with its
// error), reset picks an instance by index, evaluate with fork false
// grades and closes the env, and a verifier whose result the task's
// rules refuse answers verifier_error (not infra), as does one out of the
// task's range.
func TestTasksDatasetsAndFinish(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "double")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "dataset.yaml"), []byte(`defaults:
  image: busybox
  setup: ["mkdir -p /work && cd /work"]
  instruction: write twice $K to /work/out
  outputs: [/work/out]
  verifier: test "$(cat /work/out 2>/dev/null)" = "$(cat /grader/want)"
  reward_from: exit_status
`), 0o644)
	var lines []string
	for k := range 250 {
		lines = append(lines, fmt.Sprintf(`{"id": "d%03d", "env": {"K": "%d"}, "hidden_files": {"want": "%d"}}`, k, k, 2*k))
	}
	lines[7] = `{"id": "d007", "max_turns": -1}`
	os.WriteFile(filepath.Join(dir, "instances.jsonl"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	d, err := envpool.OpenDataset(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	huge := envpool.Task{Name: "huge", Image: "busybox", Verifier: "echo 1000000.0"}
	garbage := envpool.Task{Name: "garbage", Image: "busybox", Verifier: "echo PASSED", RewardFrom: envpool.RewardStdout}
	rubric := envpool.Task{Name: "rubric", Image: "busybox", Verifier: `echo '{"a": 1, "b": 0.5}'`, Rubric: map[string]float64{"a": 0.5, "b": 0.5}}
	p, err := envpool.NewPool(ctx, engine, []envpool.Task{huge, garbage, rubric},
		envpool.PoolOptions{Warm: -1, Logger: quiet(), Lazy: true, Datasets: []*envpool.Dataset{d}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	_, addr := newServerWith(t, server.Options{}, coordinator.Options{Tasks: coordinator.FromEnvpool(p)})
	c := dial(t, addr, nil)

	top, err := c.Tasks(ctx, arbor.TasksParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Tasks) != 3 || len(top.Datasets) != 1 || top.Datasets[0].Name != "double" || top.Datasets[0].Instances != 250 || top.NextCursor != "" {
		t.Errorf("tasks {}: %+v", top)
	}
	var names []string
	cursor, pages := "", 0
	for {
		page, err := c.Tasks(ctx, arbor.TasksParams{Dataset: "double", Cursor: cursor, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, ts := range page.Tasks {
			names = append(names, ts.Name)
			if (ts.Name == "double/d007") != (ts.Error != "") {
				t.Errorf("instance %s: error %q", ts.Name, ts.Error)
			}
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(names) != 250 || pages != 3 || names[0] != "double/d000" || names[249] != "double/d249" {
		t.Errorf("paged %d instances in %d pages (%v...)", len(names), pages, names[:3])
	}
	for _, bad := range []arbor.TasksParams{{Limit: 5000}, {Cursor: "x"}} {
		if _, err := c.Tasks(ctx, bad); !errors.Is(err, arbor.ErrInvalidParams) {
			t.Errorf("tasks %+v: %v, want invalid_params", bad, err)
		}
	}
	if _, err := c.Tasks(ctx, arbor.TasksParams{Dataset: "nope"}); err == nil || !strings.Contains(err.Error(), "unknown_task") {
		t.Errorf("tasks of no dataset: %v", err)
	}

	idx := 21
	r, err := c.Reset(ctx, arbor.ResetParams{Dataset: "double", Index: &idx})
	if err != nil {
		t.Fatal(err)
	}
	if r.Info.Task != "double/d021" {
		t.Errorf("reset by index: task %q", r.Info.Task)
	}
	sh(t, c, r.EnvID, "echo $((K * 2)) > /work/out")
	ev, err := c.Finish(ctx, r.EnvID)
	if err != nil || ev.Reward != 1 {
		t.Fatalf("finish: %+v %v", ev, err)
	}
	if _, err := c.Step(ctx, r.EnvID, arbor.Bash("true", 0)); !errors.Is(err, arbor.ErrUnknownEnv) {
		t.Errorf("step after finish: %v, want unknown_env (the env closed)", err)
	}
	if _, err := c.Reset(ctx, arbor.ResetParams{Task: "double/d007"}); !errors.Is(err, arbor.ErrBadRequest) || !strings.Contains(err.Error(), "d007") {
		t.Errorf("reset of the broken instance: %v", err)
	}

	for _, name := range []string{"huge", "garbage"} {
		r, err := c.Reset(ctx, arbor.ResetParams{Task: name})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Evaluate(ctx, r.EnvID)
		var pe *arbor.Error
		if !errors.As(err, &pe) || pe.Code != "verifier_error" || pe.Infra || pe.Retryable {
			t.Errorf("task %s: evaluate: %v, want verifier_error, not infra", name, err)
		}
		// Finishing it closes the env all the same: the task's fault.
		if _, err := c.Finish(ctx, r.EnvID); !errors.Is(err, arbor.ErrVerifierError) {
			t.Errorf("task %s: finish: %v", name, err)
		}
		if _, err := c.Step(ctx, r.EnvID, arbor.Bash("true", 0)); !errors.Is(err, arbor.ErrUnknownEnv) {
			t.Errorf("task %s: step after a failed finish: %v, want unknown_env", name, err)
		}
	}
	r, err = c.Reset(ctx, arbor.ResetParams{Task: "rubric"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err = c.Evaluate(ctx, r.EnvID)
	if err != nil || ev.Reward != 0.75 || ev.Details["reward_from"] != "rubric" {
		t.Errorf("rubric: %+v %v", ev, err)
	}
}
