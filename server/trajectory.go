package server

import (
	"context"
	"time"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server/protocol"
)

// trajectoryEnvs: a trajectory of an env takes its ticket (it runs after
// the operations queued before it, so it sees their turns); one of a
// state id names no env.
func trajectoryEnvs(_ *Server, _ *request, p *protocol.TrajectoryParams) ([]string, error) {
	if p.EnvID != "" {
		return []string{p.EnvID}, nil
	}
	return nil, nil
}

func (r *request) trajectory(ctx context.Context, p *protocol.TrajectoryParams) (any, error) {
	t, err := r.server().c.Trajectory(ctx, p.EnvID, p.StateID)
	if err != nil {
		return nil, err
	}
	return protoTrajectory(t), nil
}

// protoTrajectory is a trajectory as protocol v1 answers it.
func protoTrajectory(t *coordinator.Trajectory) *protocol.TrajectoryResult {
	out := &protocol.TrajectoryResult{EnvID: t.EnvID, StateID: t.StateID, Root: t.Root, Missing: t.Missing,
		Turns: make([]protocol.TrajectoryTurn, 0, len(t.Turns))}
	for _, x := range t.Turns {
		a, o := x.Action, x.Obs
		pt := protocol.TrajectoryTurn{Turn: x.Turn.Turn, EnvID: x.Env, StateID: x.State, Parent: x.Parent, Checkpoint: x.Kind,
			Action: protocol.Action{Tool: a.Tool, Cmd: a.Cmd, TimeoutS: a.TimeoutS, Path: a.Path, Content: a.Content,
				StateID: a.StateID, MaxOutput: a.MaxOutput},
			ActionCut: a.Cut,
			Obs: protocol.Obs{Stdout: protocol.Text(o.Stdout), Stderr: protocol.Text(o.Stderr), ExitCode: o.ExitCode,
				TimedOut: o.TimedOut, Truncated: o.Truncated, Cwd: o.Cwd, DurationS: o.DurationS},
			StdoutBytes: o.StdoutBytes, StderrBytes: o.StderrBytes, OutputCut: o.Cut, ShellRestarted: o.ShellRestarted,
			Limits: o.Limits, Started: x.Started.UTC().Format(time.RFC3339Nano), StepS: x.StepS}
		if d, ok := x.Checkpoint["total"]; ok {
			pt.CheckpointS = d.Seconds()
		}
		if v := x.Verdict; v != nil {
			r := v.Reward
			pt.Reward, pt.RewardDetails = &r, v.Details
		}
		out.Turns = append(out.Turns, pt)
	}
	return out
}
