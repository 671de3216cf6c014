package protocol

import (
	"strconv"
	"strings"

	"github.com/arbor-env/arbor/state"
)

// The params of every method of protocol v1 (docs/protocol.md,
// "Methods"): clients encode them, the server decodes them with
// DecodeParams. Limits that are options of a server (max_envs,
// max_batch) are the server's to check.

// HelloParams are the params of hello.
type HelloParams struct {
	Token string `msgpack:"token,omitempty"`
}

func (p *HelloParams) check(*checker) {}

// ResetParams are the params of reset: an image or a task.
type ResetParams struct {
	Image string `msgpack:"image,omitempty"`
	Task  string `msgpack:"task,omitempty"`
	Seed  *int64 `msgpack:"seed,omitempty"`
	// Dataset and Index pick a dataset's instance (Index, else Seed).
	Dataset string `msgpack:"dataset,omitempty"`
	Index   *int   `msgpack:"index,omitempty"`
	// Options, as Gymnasium's reset has them: max_turns (a whole number,
	// 0 for none) replaces the task's limit for this episode; others are
	// accepted and ignored.
	Options map[string]any `msgpack:"options,omitempty"`
}

// MaxTurns is options.max_turns, and whether it was given (check made
// sure it is a whole number >= 0).
func (p *ResetParams) MaxTurns() (int, bool) {
	n, ok := wholeNumber(p.Options["max_turns"])
	return int(n), ok
}

// wholeNumber is v as an integer when it is one (msgpack decodes numbers
// to any of Go's integer types, or to a float).
func wholeNumber(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case int:
		return int64(n), true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		return int64(n), n <= 1<<62
	case float64:
		return int64(n), n == float64(int64(n)) && n >= 0 && n <= 1<<52
	}
	return 0, false
}

func (p *ResetParams) check(c *checker) {
	if c.ok() && p.Image == "" && p.Task == "" && p.Dataset == "" {
		c.fail("", "reset needs image, task or dataset")
	}
	if p.Dataset != "" && p.Task != "" {
		c.fail("dataset", "reset names a task or a dataset, not both")
	}
	if p.Index != nil && p.Dataset == "" {
		c.fail("index", "an index picks an instance of a dataset: dataset is missing")
	}
	if p.Index != nil && *p.Index < 0 {
		c.fail("index", "must not be negative")
	}
	if v, given := p.Options["max_turns"]; given {
		if n, ok := wholeNumber(v); !ok || n < 0 || n > 1<<30 {
			c.fail("options.max_turns", "want a whole number >= 0 (0: no limit)")
		}
	}
}

// Action is what step does: one tool call.
type Action struct {
	Tool string `msgpack:"tool" json:"tool"`
	// bash
	Cmd string `msgpack:"cmd,omitempty" json:"cmd,omitempty"`
	// TimeoutS bounds the command of bash, read_file and write_file
	// (0: the task's command timeout, else 60 s).
	TimeoutS float64 `msgpack:"timeout_s,omitempty" json:"timeout_s,omitempty"`
	// write_file, read_file
	Path    string `msgpack:"path,omitempty" json:"path,omitempty"`
	Content []byte `msgpack:"content,omitempty" json:"content,omitempty"`
	// rollback
	StateID string `msgpack:"state_id,omitempty" json:"state_id,omitempty"`
	// MaxOutput caps each of stdout and stderr in bytes (default 256 KiB).
	MaxOutput int `msgpack:"max_output,omitempty" json:"max_output,omitempty"`
}

// Validate checks that the tool is known and has the fields it needs.
func (a *Action) Validate() error { return validate(a) }

func (a *Action) check(c *checker) {
	c.required("tool", a.Tool)
	switch a.Tool {
	case state.ToolBash:
		c.required("cmd", a.Cmd)
	case state.ToolWriteFile, state.ToolReadFile:
		c.required("path", a.Path)
	case state.ToolRollback:
		c.required("state_id", a.StateID)
	case "":
	default:
		c.fail("tool", "unknown tool %q (want one of %s)", a.Tool, strings.Join(Tools, ", "))
	}
	if a.TimeoutS < 0 {
		c.fail("timeout_s", "must not be negative")
	}
	if a.MaxOutput < 0 {
		c.fail("max_output", "must not be negative")
	}
}

// MaxKeyBytes bounds the request key of a step.
const MaxKeyBytes = 128

// StepParams are the params of step.
type StepParams struct {
	EnvID  string `msgpack:"env_id"`
	Action Action `msgpack:"action"`
	// Key, when set, makes the step idempotent: a step of the same env
	// with the same key that the server already ran answers the result it
	// recorded (info.replayed) instead of running again
	// (docs/protocol.md, "Idempotent steps").
	Key string `msgpack:"key,omitempty"`
}

func (p *StepParams) check(c *checker) {
	c.required("env_id", p.EnvID)
	p.Action.check(c.sub("action"))
	checkKey(c, p.Key)
}

func checkKey(c *checker, key string) {
	if len(key) > MaxKeyBytes {
		c.fail("key", "%d bytes, the limit is %d", len(key), MaxKeyBytes)
	}
}

// BranchParams are the params of branch: an env (its current state) or a
// state id.
type BranchParams struct {
	EnvID   string `msgpack:"env_id,omitempty"`
	StateID string `msgpack:"state_id,omitempty"`
	N       int    `msgpack:"n"`
}

func (p *BranchParams) check(c *checker) {
	if !c.ok() {
		return
	}
	if (p.EnvID == "") == (p.StateID == "") {
		c.fail("", "branch needs exactly one of env_id and state_id")
	}
	if p.N < 1 {
		c.fail("n", "want at least 1, got %d", p.N)
	}
}

// MaxPrepareN bounds prepare's n: the copies asked for per state.
const MaxPrepareN = 64

// PrepareParams are the params of prepare: states to restore n frozen
// copies of each ahead of branches from them; with wait the answer comes
// once they are ready.
type PrepareParams struct {
	StateIDs []string `msgpack:"state_ids"`
	N        int      `msgpack:"n"`
	Wait     bool     `msgpack:"wait,omitempty"`
}

func (p *PrepareParams) check(c *checker) {
	(&StateIDsParams{StateIDs: p.StateIDs}).check(c)
	if !c.isBad("n") && (p.N < 1 || p.N > MaxPrepareN) {
		c.fail("n", "want 1 to %d, got %d", MaxPrepareN, p.N)
	}
}

// EnvParams name one env: the params of checkpoint, promote, discard,
// evaluate, close and states.
type EnvParams struct {
	EnvID string `msgpack:"env_id"`
}

func (p *EnvParams) check(c *checker) { c.required("env_id", p.EnvID) }

// The methods whose params are one env.
type (
	CheckpointParams = EnvParams
	PromoteParams    = EnvParams
	DiscardParams    = EnvParams
	CloseParams      = EnvParams
	StatesParams     = EnvParams
)

// EvaluateParams are the params of evaluate: the env, and fork (default
// true). With fork false the episode is over: the env is closed once
// evaluated (docs/protocol.md, "evaluate").
type EvaluateParams struct {
	EnvID string `msgpack:"env_id"`
	Fork  *bool  `msgpack:"fork,omitempty"`
}

func (p *EvaluateParams) check(c *checker) { c.required("env_id", p.EnvID) }

// Finish says whether the env is to be closed once evaluated (fork
// false).
func (p *EvaluateParams) Finish() bool { return p.Fork != nil && !*p.Fork }

// RollbackParams are the params of rollback.
type RollbackParams struct {
	EnvID   string `msgpack:"env_id"`
	StateID string `msgpack:"state_id"`
}

func (p *RollbackParams) check(c *checker) {
	c.required("env_id", p.EnvID)
	c.required("state_id", p.StateID)
}

// MigrateParams are the params of migrate: the env, and the node to
// move it to ("": the least loaded other one).
type MigrateParams struct {
	EnvID string `msgpack:"env_id"`
	Node  string `msgpack:"node,omitempty"`
}

func (p *MigrateParams) check(c *checker) { c.required("env_id", p.EnvID) }

// StateIDsParams name states: the params of release, pin and unpin.
type StateIDsParams struct {
	StateIDs []string `msgpack:"state_ids"`
}

func (p *StateIDsParams) check(c *checker) {
	if len(p.StateIDs) == 0 && !c.isBad("state_ids") {
		c.fail("state_ids", "want at least one state id")
	}
	for i, id := range p.StateIDs {
		c.required("state_ids["+strconv.Itoa(i)+"]", id)
	}
}

// The methods whose params are states.
type (
	ReleaseParams = StateIDsParams
	PinParams     = StateIDsParams
	UnpinParams   = StateIDsParams
)

// EnvsParams are the params of envs: none.
type EnvsParams struct{}

func (p *EnvsParams) check(*checker) {}

// BatchItem is one step of a step_batch.
type BatchItem struct {
	EnvID  string `msgpack:"env_id"`
	Action Action `msgpack:"action"`
	// Key: as StepParams.Key.
	Key string `msgpack:"key,omitempty"`
}

// StepBatchParams are the params of step_batch.
type StepBatchParams struct {
	Items []BatchItem `msgpack:"items"`
}

func (p *StepBatchParams) check(c *checker) {
	if p.Items == nil {
		c.fail("items", "required array is missing")
	}
	for i := range p.Items {
		it := &p.Items[i]
		ic := c.sub("items[" + strconv.Itoa(i) + "]")
		ic.required("env_id", it.EnvID)
		it.Action.check(ic.sub("action"))
		checkKey(ic, it.Key)
	}
}

// Validate returns nil or an invalid_params *Error naming every bad field.
func (p *HelloParams) Validate() error     { return validate(p) }
func (p *ResetParams) Validate() error     { return validate(p) }
func (p *StepParams) Validate() error      { return validate(p) }
func (p *BranchParams) Validate() error    { return validate(p) }
func (p *EnvParams) Validate() error       { return validate(p) }
func (p *EvaluateParams) Validate() error  { return validate(p) }
func (p *RollbackParams) Validate() error  { return validate(p) }
func (p *EnvsParams) Validate() error      { return validate(p) }
func (p *StepBatchParams) Validate() error { return validate(p) }
func (p *StateIDsParams) Validate() error  { return validate(p) }
func (p *MigrateParams) Validate() error   { return validate(p) }
func (p *PrepareParams) Validate() error   { return validate(p) }

func validate(p Params) error {
	c := newChecker()
	p.check(c)
	return c.err()
}
