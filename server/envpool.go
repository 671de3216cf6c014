package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/envpool"
)

// FromEnvpool adapts an envpool.Pool (tasks, warm pool, verifiers, idle
// TTL) to the server's Pool.
func FromEnvpool(p *envpool.Pool) Pool { return envpoolPool{p} }

type envpoolPool struct{ p *envpool.Pool }

func taskInfo(t envpool.Task) TaskInfo {
	return TaskInfo{Name: t.Name, Image: t.Image, MaxTurns: t.MaxTurns, CommandTimeout: t.CommandTimeout}
}

// poolError wraps the pool's sentinels in the server's.
func poolError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, envpool.ErrUnknownTask):
		return fmt.Errorf("%w: %w", ErrUnknownTask, err)
	case errors.Is(err, envpool.ErrNoVerifier):
		return fmt.Errorf("%w: %w", ErrNoVerifier, err)
	case errors.Is(err, envpool.ErrBadRequest):
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	case errors.Is(err, envpool.ErrClosed):
		return fmt.Errorf("%w: %w", ErrPoolClosed, err)
	case errors.Is(err, branch.ErrRestore), errors.Is(err, branch.ErrCheckpoint):
		return err // reported with the engine's own codes
	case errors.Is(err, envpool.ErrVerifier), errors.Is(err, envpool.ErrSetup):
		return fmt.Errorf("%w: %w", ErrInfra, err)
	}
	return err
}

func (a envpoolPool) Reset(ctx context.Context, req ResetRequest) (*Reset, error) {
	r, err := a.p.Reset(ctx, envpool.ResetRequest{Task: req.Task, Image: req.Image, Seed: req.Seed})
	if err != nil {
		return nil, poolError(err)
	}
	return &Reset{Env: r.Env, StateID: r.StateID, Task: taskInfo(r.Task), Instruction: r.Instruction}, nil
}

func (a envpoolPool) Evaluate(ctx context.Context, env *branch.Env) (Evaluation, error) {
	t, ok := a.p.TaskOf(env.ID)
	if !ok {
		// An env adopted after a restart: its task is in its labels.
		if t, ok = a.p.Task(env.Labels()[labelTask]); !ok {
			t = envpool.Task{Image: env.Image}
		}
	}
	ev, err := a.p.Evaluate(ctx, env, t)
	return Evaluation{Reward: ev.Reward, Details: ev.Details}, poolError(err)
}

func (a envpoolPool) Branch(ctx context.Context, src branch.Source, n int) (*branch.BranchResult, error) {
	r, err := a.p.Branch(ctx, src, n)
	return r, poolError(err)
}

func (a envpoolPool) Promote(ctx context.Context, child *branch.Env) (string, error) {
	sid, err := a.p.Promote(ctx, child)
	return sid, poolError(err)
}

func (a envpoolPool) Discard(ctx context.Context, env *branch.Env) error {
	return poolError(a.p.Discard(ctx, env))
}

func (a envpoolPool) TaskOf(envID string) (TaskInfo, bool) {
	t, ok := a.p.TaskOf(envID)
	return taskInfo(t), ok
}

func (a envpoolPool) Touch(envID string)         { a.p.Touch(envID) }
func (a envpoolPool) Forget(envID string)        { a.p.Forget(envID) }
func (a envpoolPool) Internal(envID string) bool { return a.p.Internal(envID) }

func (a envpoolPool) TaskNames() []string {
	var names []string
	for _, t := range a.p.Tasks() {
		names = append(names, t.Name)
	}
	return names
}
