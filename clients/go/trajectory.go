package arbor

import (
	"context"

	"github.com/arbor-env/arbor/server/protocol"
)

// The trajectory types of the protocol.
type (
	TrajectoryResult = protocol.TrajectoryResult
	TrajectoryTurn   = protocol.TrajectoryTurn
)

// Trajectory returns the path from the root to env's head: every turn's
// action, observation, reward (the newest evaluate of its state) and
// timings, oldest first, as the server recorded them.
func (c *Client) Trajectory(ctx context.Context, envID string) (*TrajectoryResult, error) {
	var r TrajectoryResult
	return &r, c.Call(ctx, protocol.MethodTrajectory, protocol.TrajectoryParams{EnvID: envID}, &r)
}

// StateTrajectory returns the path from the root to a state, which may
// belong to an env closed since (while the server retains it). An
// unknown state is ErrUnknownState.
func (c *Client) StateTrajectory(ctx context.Context, stateID string) (*TrajectoryResult, error) {
	var r TrajectoryResult
	return &r, c.Call(ctx, protocol.MethodTrajectory, protocol.TrajectoryParams{StateID: stateID}, &r)
}
