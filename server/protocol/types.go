package protocol

import (
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/state"
)

// Version is the protocol version this package speaks.
const Version = 1

// Method names of protocol v1.
const (
	MethodHello      = "hello"
	MethodReset      = "reset"
	MethodStep       = "step"
	MethodBranch     = "branch"
	MethodCheckpoint = "checkpoint"
	MethodRollback   = "rollback"
	MethodPromote    = "promote"
	MethodDiscard    = "discard"
	MethodEvaluate   = "evaluate"
	MethodClose      = "close"
	MethodEnvs       = "envs"
	MethodStates     = "states"
	MethodStepBatch  = "step_batch"
	MethodRelease    = "release"
	MethodPin        = "pin"
	MethodUnpin      = "unpin"
	// MethodMigrate moves an open env to another node of a cluster
	// (docs/cluster.md, "Live migration"); only a router serves it.
	MethodMigrate = "migrate"
	// MethodPrepare is a prefetch hint: restore frozen copies of states
	// ahead of branches from them (docs/protocol.md, "prepare"); a v1
	// addition.
	MethodPrepare = "prepare"
)

// Methods lists every method of protocol v1.
var Methods = []string{MethodHello, MethodReset, MethodStep, MethodBranch, MethodCheckpoint, MethodRollback,
	MethodPromote, MethodDiscard, MethodEvaluate, MethodClose, MethodEnvs, MethodStates, MethodStepBatch,
	MethodRelease, MethodPin, MethodUnpin, MethodMigrate, MethodPrepare, MethodTrajectory, MethodTasks}

// Server notifications.
const (
	// NotifyStepBatch carries one finished item of a step_batch request.
	NotifyStepBatch = "step_batch"
	// NotifyError reports a frame the server could not attribute to a
	// request (not msgpack, not a request array).
	NotifyError = "error"
)

// Step tools.
const (
	ToolBash      = "bash"
	ToolWriteFile = "write_file"
	ToolReadFile  = "read_file"
	ToolRollback  = "rollback"
)

// Tools lists the step tools.
var Tools = []string{state.ToolBash, state.ToolWriteFile, state.ToolReadFile, state.ToolRollback}

// Text is command output: a msgpack str when it is valid UTF-8, bin
// otherwise, so text stays text for clients in any language and binary
// output (read_file of a binary file) arrives byte for byte.
type Text string

// EncodeMsgpack implements msgpack.CustomEncoder.
func (t Text) EncodeMsgpack(enc *msgpack.Encoder) error {
	if utf8.ValidString(string(t)) {
		return enc.EncodeString(string(t))
	}
	return enc.EncodeBytes([]byte(t))
}

// DecodeMsgpack implements msgpack.CustomDecoder; it takes str or bin.
func (t *Text) DecodeMsgpack(dec *msgpack.Decoder) error {
	s, err := dec.DecodeString()
	*t = Text(s)
	return err
}

// HelloResult is what hello returns.
type HelloResult struct {
	Version      int          `msgpack:"version" json:"version"`
	Server       string       `msgpack:"server" json:"server"`
	Capabilities Capabilities `msgpack:"capabilities" json:"capabilities"`
}

// Capabilities describe what this server offers and its limits.
type Capabilities struct {
	Methods         []string `msgpack:"methods" json:"methods"`
	Tools           []string `msgpack:"tools" json:"tools"`
	CheckpointKinds []string `msgpack:"checkpoint_kinds" json:"checkpoint_kinds"`
	Tasks           []string `msgpack:"tasks" json:"tasks"`
	MaxFrameBytes   int      `msgpack:"max_frame_bytes" json:"max_frame_bytes"`
	MaxInFlight     int      `msgpack:"max_in_flight" json:"max_in_flight"`
	MaxEnvs         int      `msgpack:"max_envs" json:"max_envs"`
	MaxBatch        int      `msgpack:"max_batch" json:"max_batch"`
	// EnvIdleTTLS is how long an env may stay unused before the server
	// closes it (0: never).
	EnvIdleTTLS float64 `msgpack:"env_idle_ttl_s" json:"env_idle_ttl_s"`
	// MaxUnreadBytes bounds the answers a connection holds unread before
	// the server stops reading its requests.
	MaxUnreadBytes int `msgpack:"max_unread_bytes" json:"max_unread_bytes"`
	// StepKeys: step and step_batch items take a request key that makes
	// a retry return the recorded result (docs/protocol.md, "Idempotent
	// steps").
	StepKeys bool `msgpack:"step_keys" json:"step_keys"`
}

// Obs is what a step (or reset) observed.
type Obs struct {
	Stdout    Text    `msgpack:"stdout" json:"stdout"`
	Stderr    Text    `msgpack:"stderr" json:"stderr"`
	ExitCode  int     `msgpack:"exit_code" json:"exit_code"`
	TimedOut  bool    `msgpack:"timed_out" json:"timed_out"`
	Truncated bool    `msgpack:"truncated" json:"truncated"`
	Cwd       string  `msgpack:"cwd" json:"cwd"`
	DurationS float64 `msgpack:"duration_s" json:"duration_s"`
	// Instruction is the task's instruction (reset only).
	Instruction string `msgpack:"instruction,omitempty" json:"instruction,omitempty"`
}

// Info is the bookkeeping of a reset, step or rollback.
type Info struct {
	StateID string `msgpack:"state_id" json:"state_id"`
	Turn    int    `msgpack:"turn" json:"turn"`
	// Checkpoint is the kind of checkpoint queued for this turn: none, fs,
	// proc or full.
	Checkpoint string `msgpack:"checkpoint" json:"checkpoint"`
	Tool       string `msgpack:"tool,omitempty" json:"tool,omitempty"`
	Task       string `msgpack:"task,omitempty" json:"task,omitempty"`
	Image      string `msgpack:"image,omitempty" json:"image,omitempty"`
	MaxTurns   int    `msgpack:"max_turns,omitempty" json:"max_turns,omitempty"`
	Seed       *int64 `msgpack:"seed,omitempty" json:"seed,omitempty"`
	// Restored is the state a rollback (tool or method) brought back.
	Restored string `msgpack:"restored,omitempty" json:"restored,omitempty"`
	// CheckpointError reports that the previous turn's background
	// checkpoint failed: its state id is unusable and this turn's
	// checkpoint was taken full.
	CheckpointError string   `msgpack:"checkpoint_error,omitempty" json:"checkpoint_error,omitempty"`
	ShellRestarted  bool     `msgpack:"shell_restarted,omitempty" json:"shell_restarted,omitempty"`
	Limits          []string `msgpack:"limits,omitempty" json:"limits,omitempty"`
	StdoutBytes     int64    `msgpack:"stdout_bytes,omitempty" json:"stdout_bytes,omitempty"`
	StderrBytes     int64    `msgpack:"stderr_bytes,omitempty" json:"stderr_bytes,omitempty"`
	// VerifyMisses, in verification mode (arbor serve --verify-skips),
	// lists what a restore of StateID lacked compared with the live env.
	VerifyMisses []string `msgpack:"verify_misses,omitempty" json:"verify_misses,omitempty"`
	// Recovered, on the first operation on an env after the server
	// restarted from a crash, says at which state the env was restored:
	// what it did after that state is gone.
	Recovered *Recovered `msgpack:"recovered,omitempty" json:"recovered,omitempty"`
	// Replayed: this is the recorded result of a step that already ran
	// under the same request key; nothing ran now.
	Replayed bool `msgpack:"replayed,omitempty" json:"replayed,omitempty"`
}

// Recovered is the state a restarted server restored an env at: its last
// committed state and that state's turn.
type Recovered struct {
	StateID string `msgpack:"state_id" json:"state_id"`
	Turn    int    `msgpack:"turn" json:"turn"`
}

// ResetResult is what reset returns.
type ResetResult struct {
	EnvID string `msgpack:"env_id" json:"env_id"`
	Obs   Obs    `msgpack:"obs" json:"obs"`
	Info  Info   `msgpack:"info" json:"info"`
}

// StepResult is what step returns.
type StepResult struct {
	Obs        Obs     `msgpack:"obs" json:"obs"`
	Reward     float64 `msgpack:"reward" json:"reward"`
	Terminated bool    `msgpack:"terminated" json:"terminated"`
	Truncated  bool    `msgpack:"truncated" json:"truncated"`
	Info       Info    `msgpack:"info" json:"info"`
}

// BranchResult is what branch returns: EnvIDs[i] is child i, "" when it
// failed, in which case Errors[i] says why (Errors is absent when all
// children were made).
type BranchResult struct {
	EnvIDs  []string `msgpack:"env_ids" json:"env_ids"`
	StateID string   `msgpack:"state_id" json:"state_id"`
	Errors  []*Error `msgpack:"errors,omitempty" json:"errors,omitempty"`
	TookS   float64  `msgpack:"took_s" json:"took_s"`
	// Task and Turn are what the children inherited: the task (none for
	// an image's env) and the turn of the episode they continue.
	Task string `msgpack:"task,omitempty" json:"task,omitempty"`
	Turn int    `msgpack:"turn" json:"turn"`
}

// PrepareResult is what prepare returns, by state id: Prepared counts the
// prepared copies of each named state, queued or ready, Ready those
// ready to thaw; Refused, when present, the copies asked for that did not
// fit in the server's budget.
type PrepareResult struct {
	Prepared map[string]int `msgpack:"prepared" json:"prepared"`
	Ready    map[string]int `msgpack:"ready" json:"ready"`
	Refused  map[string]int `msgpack:"refused,omitempty" json:"refused,omitempty"`
}

// CheckpointResult is what checkpoint returns.
type CheckpointResult struct {
	StateID string `msgpack:"state_id" json:"state_id"`
}

// RollbackResult is what rollback returns.
type RollbackResult struct {
	Info Info `msgpack:"info" json:"info"`
}

// MigrateResult is what migrate returns: the env lives on Node now, at
// StateID (its last committed state on From), under the same id.
type MigrateResult struct {
	EnvID   string `msgpack:"env_id" json:"env_id"`
	Node    string `msgpack:"node" json:"node"`
	From    string `msgpack:"from" json:"from"`
	StateID string `msgpack:"state_id" json:"state_id"`
	// PauseS is how long the env answered nothing (from its source's
	// last operation to its restore on Node), TookS the whole migration
	// with the pre-copy.
	PauseS float64 `msgpack:"pause_s" json:"pause_s"`
	TookS  float64 `msgpack:"took_s" json:"took_s"`
	// Bytes shipped: before the pause (PreBytes) and during it.
	PreBytes int64 `msgpack:"pre_bytes" json:"pre_bytes"`
	Bytes    int64 `msgpack:"bytes" json:"bytes"`
}

// PromoteResult is what promote returns: the origin env now holds the
// promoted child's state, and the child is closed.
type PromoteResult struct {
	EnvID   string `msgpack:"env_id" json:"env_id"`
	StateID string `msgpack:"state_id" json:"state_id"`
}

// Evaluation is what evaluate returns.
type Evaluation struct {
	Reward  float64        `msgpack:"reward" json:"reward"`
	Details map[string]any `msgpack:"details" json:"details"`
}

// EnvInfo describes an open env.
type EnvInfo struct {
	EnvID  string  `msgpack:"env_id" json:"env_id"`
	Image  string  `msgpack:"image" json:"image"`
	Task   string  `msgpack:"task,omitempty" json:"task,omitempty"`
	Origin string  `msgpack:"origin,omitempty" json:"origin,omitempty"`
	Head   string  `msgpack:"head" json:"head"`
	Turn   int     `msgpack:"turn" json:"turn"`
	IdleS  float64 `msgpack:"idle_s" json:"idle_s"`
	// Recovered: the env was restored at this state when the server
	// restarted from a crash.
	Recovered *Recovered `msgpack:"recovered,omitempty" json:"recovered,omitempty"`
	// Lost: the env was open when the server crashed and could not be
	// restored; this says why. Operations on it answer env_lost.
	Lost string `msgpack:"lost,omitempty" json:"lost,omitempty"`
}

// EnvsResult is what envs returns.
type EnvsResult struct {
	Envs []EnvInfo `msgpack:"envs" json:"envs"`
}

// StateInfo describes one checkpointed state.
type StateInfo struct {
	StateID string `msgpack:"state_id" json:"state_id"`
	Parent  string `msgpack:"parent,omitempty" json:"parent,omitempty"`
	EnvID   string `msgpack:"env_id" json:"env_id"`
	Turn    int    `msgpack:"turn" json:"turn"`
	Kind    string `msgpack:"kind" json:"kind"`
	// Created is RFC 3339 with nanoseconds.
	Created string `msgpack:"created" json:"created"`
	// Bytes is what the state's own artifacts take: the file snapshot it
	// made (what the turn wrote that it holds; 0 where the backend does
	// not tell) and the process image it made (docs/engine.md,
	// "Accounting").
	Bytes int64 `msgpack:"bytes" json:"bytes"`
}

// StatesResult is what states returns: the lineage of the env's head,
// root first (the head last).
type StatesResult struct {
	EnvID  string      `msgpack:"env_id" json:"env_id"`
	Head   string      `msgpack:"head" json:"head"`
	States []StateInfo `msgpack:"states" json:"states"`
	// Bytes is what the lineage takes: every artifact its states
	// reference, once.
	Bytes int64 `msgpack:"bytes" json:"bytes"`
}

// BatchItemResult is one finished item of a step_batch: sent as a
// notification when it finishes and repeated in the final response.
type BatchItemResult struct {
	// MsgID is the msgid of the step_batch request (notifications only).
	MsgID  uint32      `msgpack:"msgid" json:"msgid"`
	Index  int         `msgpack:"index" json:"index"`
	EnvID  string      `msgpack:"env_id" json:"env_id"`
	Result *StepResult `msgpack:"result,omitempty" json:"result,omitempty"`
	Error  *Error      `msgpack:"error,omitempty" json:"error,omitempty"`
}

// StepBatchResult is the final response of step_batch: every item, in the
// order of the request.
type StepBatchResult struct {
	Results []BatchItemResult `msgpack:"results" json:"results"`
}

// Empty is the result of methods that return nothing but success.
type Empty struct{}
