package ui

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/state"
)

// One engine (btrfs pool, CRIU, inspector, busybox image) and one task
// pool serve the tests of the trees and the feed; each makes its own
// coordinator on them.
var (
	skipReason string
	engine     *branch.Engine
	pool       *envpool.Pool
)

// countTask is a busybox task: a counter file the agent must raise.
var countTask = envpool.Task{
	Name: "count", Image: "busybox",
	Setup:       []string{"mkdir -p /work && echo 0 > /work/n && cd /work"},
	Instruction: "Make the number in /work/n at least 3.",
	Verifier:    `n=$(cat /work/n); if [ "$n" -ge 3 ]; then echo 1; else echo 0; fi`,
	MaxTurns:    3,
}

func TestMain(m *testing.M) {
	branchtest.Main(m, "ui", branchtest.Options{Inspector: true}, &skipReason, func(rig *branchtest.Rig) (func(), error) {
		engine = rig.Engine
		var err error
		pool, err = envpool.NewPool(context.Background(), engine, []envpool.Task{countTask},
			envpool.PoolOptions{Warm: 1, Logger: branchtest.Logger()})
		if err != nil {
			return nil, fmt.Errorf("prepare the task: %w", err)
		}
		return func() { pool.Close(context.Background()) }, nil
	})
}

// newLocal makes a coordinator on the shared engine and task pool, and
// the view's Source of it.
func newLocal(t *testing.T, o coordinator.Options) (*coordinator.Coordinator, *local) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	o.Engine = engine
	o.Tasks = coordinator.FromEnvpool(pool)
	o.Logger = branchtest.Logger()
	c, err := coordinator.New(o)
	if err != nil {
		t.Fatal(err)
	}
	l := Local(c).(*local)
	t.Cleanup(func() {
		for _, e := range c.Envs(context.Background()) {
			c.CloseEnv(context.Background(), e.Env.ID)
		}
		c.Close()
	})
	return c, l
}

func reset(t *testing.T, c *coordinator.Coordinator, req coordinator.ResetRequest) *coordinator.ResetResult {
	t.Helper()
	r, err := c.Reset(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// bash runs cmd as a turn.
func bash(t *testing.T, c *coordinator.Coordinator, envID, cmd string) *coordinator.TurnResult {
	t.Helper()
	r, err := c.Turn(context.Background(), envID, coordinator.Action{Tool: "bash", Cmd: cmd})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// kinds is a Classify seam that answers from a list.
type kinds struct{ next []state.Kind }

func (k *kinds) classify(context.Context, *branch.Env, string) (branch.Turn, error) {
	if len(k.next) == 0 {
		return branch.Turn{}, errors.New("no kind left")
	}
	kind := k.next[0]
	k.next = k.next[1:]
	return branch.Turn{Kind: kind}, nil
}
