package envpool_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/arbor-env/arbor/envpool"
)

// TestGraderOutputsHostile: outputs an agent shapes to hurt the grader or
// the host: a symlink to a host path, a parent directory replaced by a
// link to the root, a FIFO where a file was due, a sparse file over the
// size limit, more paths than the grader copies. Each ends in a reward
// (the range's low end, or outputs_too_large), never an error or a write
// or read outside the sandbox: the host's canary file is untouched and
// never read into the grader.
func TestGraderOutputsHostile(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	defer envpool.SetMaxOutputEntries(1000)()
	canary := filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(canary, []byte("host secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	task := envpool.Task{Name: "out", Image: "busybox", Setup: []string{"mkdir -p /work/o && cd /work/o"},
		Outputs: []string{"/work/o"}, MaxOutputBytes: 1 << 20,
		// Reads the output and writes through it: with a link to the
		// host's canary that would be the host's file.
		Verifier:   `c=$(cat /work/o/answer 2>/dev/null); echo overwritten > /work/o/answer; [ "$c" = "host secret" ] && echo leaked >&2; [ "$c" = 42 ]`,
		RewardFrom: envpool.RewardExitStatus}
	p, err := envpool.NewPool(ctx, e, []envpool.Task{task}, envpool.PoolOptions{Warm: -1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	for _, tc := range []struct {
		name, cmd, from string
	}{
		{"link to a host path", "ln -s " + canary + " /work/o/answer", "exit_status"},
		{"link up and out", "ln -s ../../../../../../.." + canary + " /work/o/answer", "exit_status"},
		{"parent is a link to the root", "cd / && rm -rf /work/o && ln -s / /work/o", "exit_status"},
		{"work is a link", "cd / && rm -rf /work && ln -s " + filepath.Dir(canary) + " /work", "exit_status"},
		{"fifo", "mkfifo /work/o/answer", "exit_status"},
		{"sparse file over the limit", "dd if=/dev/zero of=/work/o/answer bs=1 count=0 seek=10G 2>/dev/null", "outputs_too_large"},
		{"more paths than the grader copies", "mkdir d && cd d && seq 1001 | xargs touch && cd ..", "outputs_too_large"},
		{"solved, for contrast", "echo 42 > /work/o/answer", "exit_status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := p.Reset(ctx, envpool.ResetRequest{Task: "out"})
			if err != nil {
				t.Fatal(err)
			}
			defer e.CloseEnv(ctx, r.Env)
			run(t, e, r.Env, tc.cmd)
			ev, err := p.Evaluate(ctx, r.Env, task, 0)
			if err != nil {
				t.Fatalf("evaluate: %v", err)
			}
			want := 0.0
			if tc.name == "solved, for contrast" {
				want = 1
			}
			if ev.Reward != want || ev.Details["reward_from"] != tc.from {
				t.Errorf("reward %v from %v (%v), want %v from %s", ev.Reward, ev.Details["reward_from"], ev.Details, want, tc.from)
			}
			if b, err := os.ReadFile(canary); err != nil || string(b) != "host secret\n" {
				t.Fatalf("the host's canary: %q %v", b, err)
			}
		})
	}
}
