package coordinator

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/arbor-env/arbor/state"
)

// cmds lists a trajectory's commands, oldest first.
func cmds(t *testing.T, c *Coordinator, envID, stateID string) []string {
	t.Helper()
	tr, err := c.Trajectory(context.Background(), envID, stateID)
	if err != nil {
		t.Fatalf("trajectory of %s%s: %v", envID, stateID, err)
	}
	out := []string{}
	for _, x := range tr.Turns {
		out = append(out, x.Action.Cmd)
	}
	return out
}

// TestTrajectoryTurnsWithoutCheckpoint: turns that took no checkpoint
// stay with their env until its next state (a forced checkpoint here)
// takes them; a child of the env inherits them, a child of the state
// does not; a promote hands the child's path to its origin. The records
// are read back by a coordinator started again on the same file, and go
// once their states are gone.
func TestTrajectoryTurnsWithoutCheckpoint(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "trajectories.db")
	k := &kinds{next: []state.Kind{state.Full, state.None, state.None, state.None}}
	c := newCoordinator(t, Options{Classify: k.classify, Trajectories: path})
	r := reset(t, c, ResetRequest{Task: "count"})
	a := r.Env.ID
	s1 := bash(t, c, a, "echo 1 > /work/n").StateID
	if got := bash(t, c, a, "echo two"); got.StateID != s1 || got.Kind != state.None {
		t.Fatalf("second turn: state %s kind %s", got.StateID, got.Kind)
	}
	want := []string{"echo 1 > /work/n", "echo two"}
	if got := cmds(t, c, a, ""); !slices.Equal(got, want) {
		t.Fatalf("env: %q, want %q", got, want)
	}
	if got := cmds(t, c, "", s1); !slices.Equal(got, want[:1]) {
		t.Fatalf("state %s: %q, want %q", s1, got, want[:1])
	}
	ofEnv, err := c.Branch(ctx, BranchRequest{EnvID: a, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	ofState, err := c.Branch(ctx, BranchRequest{StateID: s1, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := cmds(t, c, ofEnv.Children[0].ID, ""); !slices.Equal(got, want) {
		t.Errorf("child of the env: %q, want %q", got, want)
	}
	if got := cmds(t, c, ofState.Children[0].ID, ""); !slices.Equal(got, want[:1]) {
		t.Errorf("child of the state: %q, want %q", got, want[:1])
	}
	bash(t, c, ofEnv.Children[0].ID, "echo three")
	bash(t, c, a, "echo four")
	forced, err := c.Checkpoint(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	wantA := []string{"echo 1 > /work/n", "echo two", "echo four"}
	if got := cmds(t, c, "", forced); !slices.Equal(got, wantA) {
		t.Errorf("forced checkpoint: %q, want %q", got, wantA)
	}
	wantChild := []string{"echo 1 > /work/n", "echo two", "echo three"}
	if _, sid, err := c.Promote(ctx, ofEnv.Children[0].ID); err != nil || sid != s1 {
		t.Fatalf("promote: %s, %v", sid, err)
	}
	if got := cmds(t, c, a, ""); !slices.Equal(got, wantChild) {
		t.Errorf("after the promote: %q, want %q", got, wantChild)
	}
	if _, err := c.Trajectory(ctx, "", "s-nosuch"); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("unknown state: %v", err)
	}
	if err := c.Pin(ctx, []string{forced}); err != nil {
		t.Fatal(err)
	}
	defer c.Unpin(ctx, []string{forced})

	// Another coordinator on the same records (this one closed first:
	// the file takes one opener).
	c.Close()
	c2, err := New(Options{Engine: engine, Tasks: FromEnvpool(pool), Trajectories: path})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got := cmds(t, c2, "", forced); !slices.Equal(got, wantA) {
		t.Errorf("read again: %q, want %q", got, wantA)
	}
	if n := c2.sweepTrail(); n != 0 {
		t.Errorf("sweep of live states deleted %d records", n)
	}
	for _, env := range []string{a, ofState.Children[0].ID} {
		e, err := engine.Env(env)
		if err != nil {
			t.Fatal(err)
		}
		if err := engine.CloseEnv(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := c2.Unpin(ctx, []string{forced}); err != nil {
		t.Fatal(err)
	}
	if err := engine.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.State(forced); !errors.Is(err, state.ErrUnknownState) {
		t.Fatalf("state %s survived the GC: %v", forced, err)
	}
	if n := c2.sweepTrail(); n == 0 {
		t.Error("sweep after the states went deleted nothing")
	}
	if _, ok, _ := c2.trail.Segment(forced); ok {
		t.Errorf("record of %s kept after its state went", forced)
	}
}
