package server

import (
	"context"
	"fmt"
	"time"

	"github.com/arbor-env/arbor/branch"
)

// TaskInfo is what the server needs to know of an env's task.
type TaskInfo struct {
	Name, Image string
	// MaxTurns sets truncated once an episode reaches it (0: no limit).
	MaxTurns int
	// CommandTimeout is the default timeout of a bash step (0: the
	// server's default).
	CommandTimeout time.Duration
}

// ResetRequest asks the pool for a new episode.
type ResetRequest struct {
	Task, Image string
	Seed        int64
}

// Reset is a new episode's env.
type Reset struct {
	Env         *branch.Env
	StateID     string
	Task        TaskInfo
	Instruction string
}

// Evaluation is a verifier's verdict.
type Evaluation struct {
	Reward  float64
	Details map[string]any
}

// Pool is what the server needs from the env pool (package envpool): it
// hands out envs, knows their tasks, runs verifiers, and keeps the
// bookkeeping of branches. Errors wrap ErrUnknownTask, ErrBadRequest,
// ErrNoVerifier, ErrInfra or ErrPoolClosed, or the engine's sentinels.
type Pool interface {
	Reset(ctx context.Context, req ResetRequest) (*Reset, error)
	Evaluate(ctx context.Context, env *branch.Env) (Evaluation, error)
	Branch(ctx context.Context, src branch.Source, n int) (*branch.BranchResult, error)
	Promote(ctx context.Context, child *branch.Env) (string, error)
	Discard(ctx context.Context, env *branch.Env) error
	// TaskOf returns the task of an env the pool handed out (or a branch
	// of one).
	TaskOf(envID string) (TaskInfo, bool)
	// Touch marks an env as used now (idle TTL); Forget drops it from the
	// pool's books once the server closed it.
	Touch(envID string)
	Forget(envID string)
	// Internal reports envs the pool holds in reserve: the server neither
	// lists nor accepts them.
	Internal(envID string) bool
	// TaskNames lists the tasks reset accepts.
	TaskNames() []string
}

// EnginePool is a Pool without tasks: reset starts a fresh env from an
// image. It keeps no idle TTL.
type EnginePool struct{ E *branch.Engine }

var _ Pool = EnginePool{}

// Reset implements Pool.
func (p EnginePool) Reset(ctx context.Context, req ResetRequest) (*Reset, error) {
	if req.Task != "" {
		return nil, fmt.Errorf("%w: %q (this server has no tasks)", ErrUnknownTask, req.Task)
	}
	if req.Image == "" {
		return nil, fmt.Errorf("%w: reset needs an image or a task", ErrBadRequest)
	}
	env, sid, err := p.E.NewEnv(ctx, req.Image)
	if err != nil {
		return nil, fmt.Errorf("reset image %s: %w", req.Image, err)
	}
	return &Reset{Env: env, StateID: sid, Task: TaskInfo{Image: req.Image}}, nil
}

// Evaluate implements Pool: without tasks there is no verifier.
func (p EnginePool) Evaluate(ctx context.Context, env *branch.Env) (Evaluation, error) {
	return Evaluation{}, fmt.Errorf("%w: env %s runs image %s without a task", ErrNoVerifier, env.ID, env.Image)
}

// Branch implements Pool; children of an env get it as their origin.
func (p EnginePool) Branch(ctx context.Context, src branch.Source, n int) (*branch.BranchResult, error) {
	res, err := p.E.Branch(ctx, src, n)
	if err == nil && src.Env != nil {
		for _, c := range res.Children {
			if c != nil {
				c.Origin = src.Env.ID
			}
		}
	}
	return res, err
}

// Promote implements Pool.
func (p EnginePool) Promote(ctx context.Context, child *branch.Env) (string, error) {
	return p.E.Promote(ctx, child)
}

// Discard implements Pool.
func (p EnginePool) Discard(ctx context.Context, env *branch.Env) error {
	return p.E.CloseEnv(ctx, env)
}

// TaskOf implements Pool.
func (EnginePool) TaskOf(string) (TaskInfo, bool) { return TaskInfo{}, false }

// Touch implements Pool.
func (EnginePool) Touch(string) {}

// Forget implements Pool.
func (EnginePool) Forget(string) {}

// Internal implements Pool.
func (EnginePool) Internal(string) bool { return false }

// TaskNames implements Pool.
func (EnginePool) TaskNames() []string { return nil }
