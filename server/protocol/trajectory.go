package protocol

// MethodTrajectory returns the path from the root to a state, or to an
// env's head: every turn's action, observation, reward and timings
// (docs/protocol.md, "trajectory"); a v1 addition.
const MethodTrajectory = "trajectory"

// TrajectoryParams are the params of trajectory: an env (its head) or a
// state id.
type TrajectoryParams struct {
	EnvID   string `msgpack:"env_id,omitempty"`
	StateID string `msgpack:"state_id,omitempty"`
}

func (p *TrajectoryParams) check(c *checker) {
	if c.ok() && (p.EnvID == "") == (p.StateID == "") {
		c.fail("", "trajectory needs exactly one of env_id and state_id")
	}
}

// Validate returns nil or an invalid_params *Error naming every bad field.
func (p *TrajectoryParams) Validate() error { return validate(p) }

// TrajectoryTurn is one turn of a trajectory: the action as it was sent,
// what it observed (stdout and stderr kept up to the server's cap per
// turn, head and tail: OutputCut), the state it led to and its checkpoint
// kind, the newest evaluation of that state and the turn's timings.
type TrajectoryTurn struct {
	Turn int `msgpack:"turn" json:"turn"`
	// EnvID is the env that ran the turn (an ancestor's, for the turns a
	// branch inherited).
	EnvID string `msgpack:"env_id" json:"env_id"`
	// StateID is the state after the turn, Parent the one before (the
	// same for a turn whose checkpoint is none).
	StateID    string `msgpack:"state_id" json:"state_id"`
	Parent     string `msgpack:"parent" json:"parent"`
	Checkpoint string `msgpack:"checkpoint" json:"checkpoint"`
	Action     Action `msgpack:"action" json:"action"`
	// ActionCut: the recorded cmd or content was cut at the server's cap.
	ActionCut bool `msgpack:"action_cut,omitempty" json:"action_cut,omitempty"`
	Obs       Obs  `msgpack:"obs" json:"obs"`
	// StdoutBytes and StderrBytes are the sizes before any cap;
	// OutputCut says the record kept less than the step returned.
	StdoutBytes    int64    `msgpack:"stdout_bytes" json:"stdout_bytes"`
	StderrBytes    int64    `msgpack:"stderr_bytes" json:"stderr_bytes"`
	OutputCut      bool     `msgpack:"output_cut,omitempty" json:"output_cut,omitempty"`
	ShellRestarted bool     `msgpack:"shell_restarted,omitempty" json:"shell_restarted,omitempty"`
	Limits         []string `msgpack:"limits,omitempty" json:"limits,omitempty"`
	// Reward is the newest evaluate of StateID (absent: none was made),
	// RewardDetails its details.
	Reward        *float64       `msgpack:"reward,omitempty" json:"reward,omitempty"`
	RewardDetails map[string]any `msgpack:"reward_details,omitempty" json:"reward_details,omitempty"`
	// Started is when the step began (RFC 3339 with nanoseconds), StepS
	// how long the step took, obs.duration_s the command alone, and
	// CheckpointS the background checkpoint of the state the turn made
	// (0 for a turn that made none, or while it runs).
	Started     string  `msgpack:"started" json:"started"`
	StepS       float64 `msgpack:"step_s" json:"step_s"`
	CheckpointS float64 `msgpack:"checkpoint_s" json:"checkpoint_s"`
}

// TrajectoryResult is what trajectory returns: the turns from the root
// (Root) to StateID, oldest first.
type TrajectoryResult struct {
	EnvID   string           `msgpack:"env_id,omitempty" json:"env_id,omitempty"`
	StateID string           `msgpack:"state_id" json:"state_id"`
	Root    string           `msgpack:"root" json:"root"`
	Turns   []TrajectoryTurn `msgpack:"turns" json:"turns"`
	// Missing are states on the path whose turns the server has no
	// record of; the path skips what led to them.
	Missing []string `msgpack:"missing,omitempty" json:"missing,omitempty"`
}
