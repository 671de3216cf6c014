package coordinator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/envpool"
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
	rig, err := branchtest.New(branchtest.Options{Inspector: true})
	switch {
	case errors.Is(err, branchtest.ErrSkip):
		skipReason = err.Error()
	case err != nil:
		fmt.Fprintln(os.Stderr, "coordinator tests: set up the engine:", err)
		os.Exit(1)
	default:
		engine = rig.Engine
		pool, err = envpool.NewPool(context.Background(), engine, []envpool.Task{countTask},
			envpool.PoolOptions{Warm: 1, Logger: branchtest.Logger()})
		if err != nil {
			rig.Close()
			fmt.Fprintln(os.Stderr, "coordinator tests: prepare the task:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if rig != nil {
		pool.Close(context.Background())
		rig.Close()
	}
	os.Exit(code)
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
		for _, e := range c.Envs() {
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
	next []branch.Kind
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
