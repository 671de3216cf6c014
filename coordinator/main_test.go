package coordinator

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/state"
)

// One engine (btrfs pool, CRIU, inspector, busybox image) and one task
// pool serve every test of the package; each test makes its own
// Coordinator on them.
var (
	skipReason string
	engine     *branch.Engine
	pool       *envpool.Pool
)

// countTask is a busybox task: a counter file the agent must raise.
var countTask = envpool.Task{
	Name: "count", Image: "busybox",
	Setup:          []string{"mkdir -p /work && echo 0 > /work/n && cd /work"},
	Instruction:    "Make the number in /work/n at least 3.",
	Verifier:       `n=$(cat /work/n); if [ "$n" -ge 3 ]; then echo 1; else echo 0; fi; echo "seed=$ARBOR_SEED" >&2`,
	MaxTurns:       3,
	CommandTimeout: 2 * time.Second,
}

func TestMain(m *testing.M) {
	branchtest.Main(m, "coordinator", branchtest.Options{Inspector: true}, &skipReason, func(rig *branchtest.Rig) (func(), error) {
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

// newCoordinator makes a coordinator on the shared engine and task pool.
func newCoordinator(t *testing.T, o Options) *Coordinator {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	o.Engine = engine
	if o.Tasks == nil {
		o.Tasks = FromEnvpool(pool)
	}
	o.Logger = branchtest.Logger()
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, e := range c.Envs(context.Background()) {
			c.CloseEnv(context.Background(), e.Env.ID)
		}
		c.Close()
	})
	return c
}

func reset(t *testing.T, c *Coordinator, req ResetRequest) *ResetResult {
	t.Helper()
	r, err := c.Reset(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// bash runs cmd as a turn.
func bash(t *testing.T, c *Coordinator, envID, cmd string) *TurnResult {
	t.Helper()
	r, err := c.Turn(context.Background(), envID, Action{Tool: "bash", Cmd: cmd})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// kinds is a Classify seam that answers from a list and records the
// commands it saw.
type kinds struct {
	next []state.Kind
	seen []string
}

func (k *kinds) classify(_ context.Context, _ *branch.Env, cmd string) (branch.Turn, error) {
	k.seen = append(k.seen, cmd)
	if len(k.next) == 0 {
		return branch.Turn{}, errors.New("no kind left")
	}
	kind := k.next[0]
	k.next = k.next[1:]
	return branch.Turn{Kind: kind}, nil
}
