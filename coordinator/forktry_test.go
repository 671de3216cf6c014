package coordinator

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/state"
)

// TestForkTry: the command runs on a throwaway branch, its file changes
// are listed without the sandbox's own, and the env, its head and the
// registry are left as they were.
func TestForkTry(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	head := bash(t, c, r.Env.ID, "echo 1 > /keep; echo 1 > /gone").StateID
	tr, err := c.ForkTry(ctx, r.Env.ID, Action{Cmd: "rm /gone; echo 2 > /keep; echo 3 > /new; echo tried"})
	if err != nil {
		t.Fatal(err)
	}
	if tr.FromState != head || tr.ChangesErr != nil || string(tr.Result.Stdout) != "tried\n" {
		t.Fatalf("fork_try: from %s (want %s), changes error %v, stdout %q", tr.FromState, head, tr.ChangesErr, tr.Result.Stdout)
	}
	want := []FileChange{{"/gone", "deleted"}, {"/keep", "modified"}, {"/new", "added"}}
	got := slices.Clone(tr.Changes)
	slices.SortFunc(got, func(a, b FileChange) int { return strings.Compare(a.Path, b.Path) })
	if !slices.Equal(got, want) {
		t.Errorf("changes %v, want %v", got, want)
	}
	if env, _ := c.Env(r.Env.ID); env.Head() != head {
		t.Errorf("env's head moved to %s", env.Head())
	}
	if n := len(c.Envs(ctx)); n != 1 {
		t.Errorf("%d envs handed out after fork_try, want 1", n)
	}
	if out := bash(t, c, r.Env.ID, "cat /keep /gone; test -e /new && echo new").Result.Stdout; string(out) != "1\n1\n" {
		t.Errorf("fork_try changed the env: %q", out)
	}
	if _, err := c.ForkTry(ctx, "nope", Action{Cmd: "true"}); !errors.Is(err, state.ErrUnknownEnv) {
		t.Errorf("fork_try of an unknown env: %v, want ErrUnknownEnv", err)
	}
}

// TestAdapterReads: the web diff's reads answer the coordinator's
// sentinel for an unknown state, as an evaluation without a verifier
// does; a child names its origin.
func TestAdapterReads(t *testing.T) {
	c := newCoordinator(t, Options{Classify: Full})
	ctx := context.Background()
	r := reset(t, c, ResetRequest{Image: "busybox"})
	b := bash(t, c, r.Env.ID, "echo x > /x").StateID
	if _, _, err := c.Head(ctx, r.Env.ID); err != nil {
		t.Fatal(err)
	}
	cmp, err := c.Compare(ctx, r.StateID, b)
	if err != nil {
		t.Fatal(err)
	}
	if cmp.A.ID != r.StateID || cmp.B.ID != b || cmp.B.Env != r.Env.ID || !slices.Contains(cmp.Changes, FileChange{"/x", "added"}) {
		t.Errorf("compare: %+v", cmp)
	}
	if _, err := c.Compare(ctx, r.StateID, "nope"); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("compare with an unknown state: %v, want ErrUnknownState", err)
	}
	if _, _, err := c.StateFiles("nope"); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("files of an unknown state: %v, want ErrUnknownState", err)
	}
	env, _ := c.Env(r.Env.ID)
	if _, err := FromEnvpool(pool).Evaluate(ctx, env, TaskInfo{}, 0); !errors.Is(err, state.ErrNoVerifier) {
		t.Errorf("evaluate without a verifier: %v, want state.ErrNoVerifier", err)
	}
	br, err := c.Branch(ctx, BranchRequest{EnvID: r.Env.ID, N: 1})
	if err != nil || br.Errors[0] != nil {
		t.Fatalf("branch: %v %v", err, br.Errors)
	}
	if got := c.Origin(br.Children[0].ID); got != r.Env.ID {
		t.Errorf("child's origin %q, want %s", got, r.Env.ID)
	}
	if got := c.Origin("nope"); got != "" {
		t.Errorf("origin of an unknown env: %q", got)
	}
}
