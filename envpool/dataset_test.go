package envpool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/state"
)

// writeDataset makes a dataset of n instances in a new directory: each
// instance k must write k*k to /work/out, checked against a hidden answer;
// the lines listed in broken are replaced by what they hold.
func writeDataset(tb testing.TB, n int, broken map[int]string) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "squares")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	head := `name: squares
defaults:
  image: busybox
  setup: ["mkdir -p /work && cd /work"]
  instruction: write the square of $K to /work/out
  outputs: [/work/out]
  env: {SHARED: yes}
  hidden_files: {README: the answer is in want}
  verifier: test "$(cat /work/out 2>/dev/null)" = "$(cat /grader/want)" && test "$SHARED" = yes
  reward_from: exit_status
  tags: [generated]
`
	if err := os.WriteFile(filepath.Join(dir, "dataset.yaml"), []byte(head), 0o644); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "instances.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	for k := range n {
		if b, ok := broken[k]; ok {
			fmt.Fprintln(f, b)
			continue
		}
		line, _ := json.Marshal(map[string]any{
			"id":           fmt.Sprintf("sq-%05d", k),
			"env":          map[string]string{"K": fmt.Sprint(k)},
			"hidden_files": map[string]string{"want": fmt.Sprint(k * k)},
			"solution":     fmt.Sprintf("echo %d > /work/out", k*k),
		})
		fmt.Fprintln(f, string(line))
	}
	return dir
}

func TestOpenDataset(t *testing.T) {
	dir := writeDataset(t, 50, map[int]string{
		3:  `not json`,
		7:  `{"env": {"K": "7"}}`,                             // no name
		9:  `{"id": "sq-00001"}`,                              // a name again
		11: `{"id": "sq-bad", "max_turns": -1}`,               // indexed; invalid when read
		13: `{"id": "sq-typo", "verifierr": "true"}`,          // indexed; unknown field when read
		15: `{"id": "sq-ok", "env": {"K": "15"}, "tags": []}`, // fine
	})
	start := time.Now()
	d, err := envpool.OpenDataset(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t.Logf("opened in %s: %d instances, broken %v", time.Since(start), d.Len(), d.Broken)
	if d.Name != "squares" || d.Len() != 47 || len(d.Broken) != 3 {
		t.Fatalf("dataset %s: %d instances, %d broken lines (%v); want squares, 47, 3", d.Name, d.Len(), len(d.Broken), d.Broken)
	}
	for _, want := range []string{"line 4", "line 8", "line 10"} {
		if !strings.Contains(errors.Join(d.Broken...).Error(), want) {
			t.Errorf("the broken lines do not name %s: %v", want, d.Broken)
		}
	}
	i, ok := d.Index("sq-00020")
	if !ok {
		t.Fatal("instance sq-00020 not indexed")
	}
	task, err := d.Instance(i)
	if err != nil {
		t.Fatal(err)
	}
	if task.Name != "squares/sq-00020" || task.Image != "busybox" || task.Env["K"] != "20" || task.Env["SHARED"] != "yes" ||
		task.HiddenFiles["want"] != "400" || task.HiddenFiles["README"] == "" || len(task.Outputs) != 1 || len(task.Tags) != 1 {
		t.Errorf("instance merged with the defaults: %+v", task)
	}
	// Reading one instance leaves the defaults as they were.
	other, _ := d.Index("sq-00021")
	if t2, err := d.Instance(other); err != nil || t2.Env["K"] != "21" || t2.HiddenFiles["want"] != "441" {
		t.Errorf("the next instance: %+v %v", t2, err)
	}
	for name, want := range map[string]string{"sq-bad": "max_turns", "sq-typo": "verifierr"} {
		i, ok := d.Index(name)
		if !ok {
			t.Fatalf("%s not indexed", name)
		}
		if _, err := d.Instance(i); !errors.Is(err, envpool.ErrInvalidTask) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), want) {
			t.Errorf("instance %s: %v, want an invalid task naming it and %s", name, err, want)
		}
	}
	if i, ok := d.Index("sq-ok"); !ok {
		t.Error("sq-ok not indexed")
	} else if tk, err := d.Instance(i); err != nil || len(tk.Tags) != 0 {
		t.Errorf("sq-ok: %+v, %v (its empty tags replace the defaults')", tk, err)
	}
}

// TestDatasetEpisodes: a pool serves a dataset lazily: reset by index,
// by seed and by name, each instance set up on its first use; a broken
// instance is an error naming it while the others go on; with room for
// one prepared instance the others are evicted and prepared again, and
// an env of an evicted instance is still evaluated.
func TestDatasetEpisodes(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	d, err := envpool.OpenDataset(writeDataset(t, 20, map[int]string{5: `{"id": "sq-broken", "max_turns": -3}`}))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p, err := envpool.NewPool(ctx, e, nil, envpool.PoolOptions{Logger: quiet(), Lazy: true, Datasets: []*envpool.Dataset{d}, MaxInstances: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	idx := 3
	r3, err := p.Reset(ctx, envpool.ResetRequest{Dataset: "squares", Index: &idx})
	if err != nil {
		t.Fatal(err)
	}
	if r3.Task.Name != "squares/sq-00003" || !strings.Contains(r3.Instruction, "$K") {
		t.Errorf("reset by index: %+v", r3.Task)
	}
	if got := run(t, e, r3.Env, `echo $K`); got != "3" {
		t.Errorf("K = %q", got)
	}
	ev, err := p.Evaluate(ctx, r3.Env, r3.Task, 0)
	if err != nil || ev.Reward != 0 {
		t.Errorf("untouched instance: %v %v", ev, err)
	}
	run(t, e, r3.Env, r3.Task.Solution)
	// Another instance (by seed: 27 mod 20 = 7), evicting the first's
	// template.
	r7, err := p.Reset(ctx, envpool.ResetRequest{Dataset: "squares", Seed: 27})
	if err != nil {
		t.Fatal(err)
	}
	if r7.Task.Name != "squares/sq-00007" {
		t.Errorf("reset by seed 27 gave %s, want squares/sq-00007", r7.Task.Name)
	}
	if _, err := p.Reset(ctx, envpool.ResetRequest{Task: "squares/sq-00012"}); err != nil {
		t.Errorf("reset by name: %v", err)
	}
	// sq-00003's template is gone (one instance kept): its env is
	// evaluated all the same, and its state still names its task.
	if ev, err := p.Evaluate(ctx, r3.Env, r3.Task, 0); err != nil || ev.Reward != 1 {
		t.Errorf("solved instance after its eviction: %v %v", ev, err)
	}
	if tk, ok := p.TaskOfState(r3.StateID); !ok || tk.Name != "squares/sq-00003" {
		t.Errorf("TaskOfState of an evicted instance's state: %v %v", tk.Name, ok)
	}
	// Instance 7's solution written to instance 3's answer is wrong.
	run(t, e, r7.Env, "echo 9 > /work/out")
	if ev, err := p.Evaluate(ctx, r7.Env, r7.Task, 0); err != nil || ev.Reward != 0 {
		t.Errorf("instance 7 with instance 3's answer: %v %v", ev, err)
	}
	_, err = p.Reset(ctx, envpool.ResetRequest{Task: "squares/sq-broken"})
	if !errors.Is(err, envpool.ErrInvalidTask) || !strings.Contains(err.Error(), "sq-broken") {
		t.Errorf("broken instance: %v", err)
	}
	for _, req := range []envpool.ResetRequest{
		{Task: "squares/nope"}, {Task: "nope/sq-00001"}, {Dataset: "nope", Seed: 1},
	} {
		if _, err := p.Reset(ctx, req); !errors.Is(err, state.ErrUnknownTask) {
			t.Errorf("reset %+v: %v, want unknown task", req, err)
		}
	}
	big := 20
	for _, req := range []envpool.ResetRequest{{Dataset: "squares", Index: &big}, {Dataset: "squares"}, {Dataset: "squares", Task: "x", Seed: 1}} {
		if _, err := p.Reset(ctx, req); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("reset %+v: %v, want bad request", req, err)
		}
	}
	// The pool still serves after all that.
	if _, err := p.Reset(ctx, envpool.ResetRequest{Dataset: "squares", Index: &idx}); err != nil {
		t.Errorf("reset after the errors: %v", err)
	}
}

// TestLazyPoolSkipsBrokenTask: with Lazy, a task whose setup fails does
// not stop the pool: its resets answer the failure, naming the command,
// and the other tasks serve.
func TestLazyPoolSkipsBrokenTask(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	broken := envpool.Task{Name: "broken", Image: "busybox", Setup: []string{"exit 3"}, Verifier: "true"}
	start := time.Now()
	p, err := envpool.NewPool(ctx, e, []envpool.Task{broken, helloTask}, envpool.PoolOptions{Logger: quiet(), Lazy: true, Warm: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	t.Logf("lazy NewPool returned in %s", time.Since(start))
	if _, err := p.Reset(ctx, envpool.ResetRequest{Task: "broken"}); !errors.Is(err, envpool.ErrSetup) || !strings.Contains(err.Error(), "exit 3") {
		t.Errorf("reset of the broken task: %v", err)
	}
	r, err := p.Reset(ctx, envpool.ResetRequest{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, e, r.Env, "pwd"); got != "/work/hello" {
		t.Errorf("hello's env starts in %q", got)
	}
}

// TestOnDemandPool: with OnDemand a lazy pool prepares a task on its
// first reset and no other (serve --prepare on-demand).
func TestOnDemandPool(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	second := envpool.Task{Name: "second", Image: "busybox", Setup: []string{"echo ready > /r"}, Verifier: "true"}
	p, err := envpool.NewPool(ctx, e, []envpool.Task{helloTask, second}, envpool.PoolOptions{Logger: quiet(), Lazy: true, OnDemand: true, Warm: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	prepared := func() map[string]bool {
		m := map[string]bool{}
		for _, ts := range p.Stats().Tasks {
			m[ts.Name] = ts.State != ""
		}
		return m
	}
	if got := prepared(); got["hello"] || got["second"] {
		t.Fatalf("prepared before any reset: %v", got)
	}
	r, err := p.Reset(ctx, envpool.ResetRequest{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseEnv(ctx, r.Env)
	// hello's warm reserve fills after its preparation; by then a pool
	// preparing ahead would have begun the next task too.
	deadline := time.Now().Add(time.Minute)
	for {
		st := p.Stats().Tasks
		if st[0].Ready >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hello's warm reserve never filled: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if got := prepared(); !got["hello"] || got["second"] {
		t.Fatalf("after hello's first reset: %v, want hello alone prepared", got)
	}
	r2, err := p.Reset(ctx, envpool.ResetRequest{Task: "second"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseEnv(ctx, r2.Env)
	if got := run(t, e, r2.Env, "cat /r"); got != "ready" {
		t.Errorf("second's env: /r = %q", got)
	}
}
