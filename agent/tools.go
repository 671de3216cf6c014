package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// Options configure Tools. Zero values take the defaults.
type Options struct {
	// Coordinator owns the envs (the ones MCP sessions start too, from a
	// task or an image), their idle TTL and the turn rule: bash and
	// write_file are turns it classifies, read_file a turn of kind none.
	Coordinator *coordinator.Coordinator
	// MaxOutput caps each of stdout and stderr in an observation (default
	// 64 KiB; the head and the tail are kept).
	MaxOutput int
	// MaxReadBytes caps read_file (default 256 KiB).
	MaxReadBytes int
	// KeepStates bounds the per-env log list_states reads (default 1000
	// entries, oldest dropped).
	KeepStates int
	Logger     *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.MaxOutput <= 0 {
		o.MaxOutput = 64 << 10
	}
	if o.MaxReadBytes <= 0 {
		o.MaxReadBytes = 256 << 10
	}
	if o.KeepStates <= 0 {
		o.KeepStates = 1000
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Tools serves the agent tool set over the environments of one engine. It
// keeps, per environment, the log of states its tools made; sessions on
// the same environment share it.
type Tools struct {
	o   Options
	c   *coordinator.Coordinator
	log *slog.Logger

	mu   sync.Mutex
	logs map[string]*history // by env id
}

// New makes the tool set on an open engine.
func New(o Options) (*Tools, error) {
	if o.Coordinator == nil {
		return nil, fmt.Errorf("%w: agent.Options.Coordinator is required", ErrBadArgument)
	}
	o = o.withDefaults()
	return &Tools{o: o, c: o.Coordinator, log: o.Logger, logs: map[string]*history{}}, nil
}

// Entry is one state the tools made (or found when first attached).
type Entry struct {
	StateID string `json:"state_id"`
	// Turn is the state's turn in the env's episode, as the protocol's
	// info.turn counts it (the entry made at attachment: the turn then).
	Turn int `json:"turn"`
	// Tool and Command say what produced the state.
	Tool     string `json:"tool,omitempty"`
	Command  string `json:"command"`
	ExitCode int    `json:"exit_code"`
	// Cwd is the shell's working directory in that state.
	Cwd  string    `json:"cwd,omitempty"`
	Time time.Time `json:"-"`
}

// history is the log of one environment. Its mutex is held for the whole
// of each tool call, so the log's order is the order of the calls.
type history struct {
	mu      sync.Mutex
	envID   string
	entries []Entry
	keep    int
}

func (h *history) add(e Entry) {
	h.entries = append(h.entries, e)
	if over := len(h.entries) - h.keep; over > 0 {
		h.entries = slices.Delete(h.entries, 0, over)
	}
}

// find returns the newest entry of state sid.
func (h *history) find(sid string) (Entry, bool) {
	for i := len(h.entries) - 1; i >= 0; i-- {
		if h.entries[i].StateID == sid {
			return h.entries[i], true
		}
	}
	return Entry{}, false
}

func (h *history) last() Entry { return h.entries[len(h.entries)-1] }

// Session is the tool set bound to one environment.
type Session struct {
	t  *Tools
	id string // the env's
	h  *history
}

// Attach binds the tools to env envID, one the coordinator handed out.
// The first attachment starts the env's log with its current state as
// turn 0, described by note ("" for a default).
func (t *Tools) Attach(envID, note string) (*Session, error) {
	env, err := t.c.Env(envID)
	if err != nil {
		return nil, coordError("env "+envID, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for id := range t.logs {
		if !t.c.Has(id) {
			delete(t.logs, id) // closed elsewhere
		}
	}
	h, ok := t.logs[env.ID]
	if !ok {
		if note == "" {
			note = "(state when the agent tools were attached)"
		}
		turn, _ := t.c.EpisodeTurn(env.ID)
		h = &history{envID: env.ID, keep: t.o.KeepStates}
		h.add(Entry{StateID: env.Head(), Turn: turn, Command: note, Time: time.Now()})
		t.logs[env.ID] = h
	}
	return &Session{t: t, id: env.ID, h: h}, nil
}

// Forget drops the log of an environment that was closed.
func (t *Tools) Forget(envID string) {
	t.mu.Lock()
	delete(t.logs, envID)
	t.mu.Unlock()
}

// coordError words a failure of the coordinator, the engine or the
// sandbox for the agent by the one error mapping (protocol.ErrorOf),
// whose *protocol.Error stays in the chain (toolError words the model's
// message from its flags): the client's kind of mistake is the agent's
// (ErrBadArgument, state.ErrUnknownState), an infra failure is not its doing
// (state.ErrInfra), and the rest (an env closed, too many envs) is neither.
func coordError(what string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	pe := protocol.ErrorOf(err)
	switch {
	case pe.Infra:
		return fmt.Errorf("%w: %s: %w", state.ErrInfra, what, pe)
	case pe.Code == protocol.CodeUnknownState:
		return fmt.Errorf("%w: %s: %w", state.ErrUnknownState, what, pe)
	case pe.Code == protocol.CodeTooLarge, pe.Code == protocol.CodeBadRequest, pe.Code == protocol.CodeInvalidParams,
		pe.Code == protocol.CodeUnknownTask:
		return fmt.Errorf("%w: %s: %w", ErrBadArgument, what, pe)
	}
	return fmt.Errorf("%s: %w", what, pe)
}

// lock takes the env's ticket (the coordinator's per-env FIFO, shared
// with protocol requests) and then the log's mutex; the returned func
// releases both. It fails when the env is no longer open.
func (s *Session) lock() (func(), error) {
	wait, release := s.t.c.Ticket(s.id)
	wait()
	s.h.mu.Lock()
	unlock := func() { s.h.mu.Unlock(); release() }
	if _, err := s.t.c.Env(s.id); err != nil {
		unlock()
		s.t.Forget(s.id) // closed elsewhere: its log goes too
		return nil, coordError("env "+s.id, err)
	}
	return unlock, nil
}

// timeout is the timeout the agent asked for (0: none; the coordinator
// then applies the task's command timeout, else its default, and caps
// any).
func timeout(seconds float64) (time.Duration, error) {
	if seconds < 0 {
		return 0, fmt.Errorf("%w: timeout_s must be positive, got %g", ErrBadArgument, seconds)
	}
	return time.Duration(seconds * float64(time.Second)), nil
}

// ran is one command run in the environment and the state after it.
type ran struct {
	*coordinator.TurnResult
	warning string
}

// run executes a as one turn of the coordinator (which classifies it,
// unless read-only, and checkpoints it in the background); the caller
// holds the lock. label is what list_states will show for it.
func (s *Session) run(ctx context.Context, label string, a coordinator.Action) (*ran, error) {
	env, err := s.t.c.Env(s.id)
	if err != nil {
		return nil, coordError("env "+s.id, err)
	}
	prev := env.Head()
	r, err := s.t.c.Turn(ctx, s.id, a)
	if err != nil {
		return nil, coordError("run "+a.Tool, err)
	}
	res := r.Result
	out := &ran{TurnResult: r}
	if r.CheckpointError != nil {
		out.warning = "the previous state could not be saved (" + r.CheckpointError.Error() + "); this call's state includes its changes"
	}
	if r.StateID != prev {
		s.h.add(Entry{StateID: r.StateID, Turn: r.Turn, Tool: a.Tool, Command: label, ExitCode: res.ExitCode, Cwd: res.Cwd, Time: time.Now()})
	}
	return out, nil
}

// BashArgs are the arguments of bash.
type BashArgs struct {
	Cmd      string  `json:"cmd" jsonschema:"the shell command line to run (POSIX sh syntax; pipes, &&, redirections and multi-line scripts are fine)"`
	TimeoutS float64 `json:"timeout_s,omitempty" jsonschema:"seconds before the command is killed (default: the task's command timeout, else 60); the shell itself survives a timeout"`
}

// BashResult is what bash did.
type BashResult struct {
	ExitCode  int     `json:"exit_code"`
	Stdout    string  `json:"stdout"`
	Stderr    string  `json:"stderr"`
	TimedOut  bool    `json:"timed_out,omitempty"`
	Truncated bool    `json:"truncated,omitempty"`
	Cwd       string  `json:"cwd"`
	DurationS float64 `json:"duration_s"`
	// ShellRestarted: the command ended the shell (exit, exec); a fresh
	// one with empty variables took its place.
	ShellRestarted bool `json:"shell_restarted,omitempty"`
	// StateID is the state after the command; Turn its turn.
	StateID string `json:"state_id"`
	Turn    int    `json:"turn"`
	Warning string `json:"warning,omitempty"`
}

// Bash runs a command in the environment's persistent shell.
func (s *Session) Bash(ctx context.Context, a BashArgs) (*BashResult, error) {
	if strings.TrimSpace(a.Cmd) == "" {
		return nil, fmt.Errorf("%w: cmd is empty: pass the command line to run", ErrBadArgument)
	}
	timeout, err := timeout(a.TimeoutS)
	if err != nil {
		return nil, err
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	r, err := s.run(ctx, a.Cmd, coordinator.Action{Tool: state.ToolBash, Cmd: a.Cmd, Timeout: timeout, MaxOutput: s.t.o.MaxOutput})
	if err != nil {
		return nil, err
	}
	res := r.Result
	return &BashResult{ExitCode: res.ExitCode, Stdout: string(res.Stdout), Stderr: string(res.Stderr), TimedOut: res.TimedOut,
		Truncated: res.Truncated, Cwd: res.Cwd, DurationS: res.Duration.Seconds(), ShellRestarted: res.ShellRestarted,
		StateID: r.StateID, Turn: r.Turn, Warning: r.warning}, nil
}

// file runs a file tool's action a as one turn (read_file, write_file):
// a failure of the command (no such file, permission denied) is
// ErrCommandFailed with the shell's words.
func (s *Session) file(ctx context.Context, label string, a coordinator.Action) (*ran, error) {
	if a.Path == "" {
		return nil, fmt.Errorf("%w: path is empty", ErrBadArgument)
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	r, err := s.run(ctx, label, a)
	if err != nil {
		return nil, err
	}
	if r.Result.ExitCode != 0 {
		return nil, fmt.Errorf("%w: %s %s: %s", ErrCommandFailed, a.Tool, a.Path, strings.TrimSpace(string(r.Result.Stderr)))
	}
	return r, nil
}

// ReadFileArgs are the arguments of read_file.
type ReadFileArgs struct {
	Path string `json:"path" jsonschema:"the file to read; relative paths start at the shell's current directory"`
}

// ReadFileResult is a file's content.
type ReadFileResult struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	// Bytes is the file's size; Truncated says Content holds only its head
	// and tail.
	Bytes     int64 `json:"bytes"`
	Truncated bool  `json:"truncated,omitempty"`
}

// ReadFile returns a file's content. It makes no state.
func (s *Session) ReadFile(ctx context.Context, a ReadFileArgs) (*ReadFileResult, error) {
	r, err := s.file(ctx, "read_file "+a.Path, coordinator.Action{Tool: state.ToolReadFile, Path: a.Path,
		Timeout: 30 * time.Second, MaxOutput: s.t.o.MaxReadBytes, ReadOnly: true})
	if err != nil {
		return nil, err
	}
	return &ReadFileResult{Path: a.Path, Content: string(r.Result.Stdout), Bytes: r.Result.StdoutBytes, Truncated: r.Result.Truncated}, nil
}

// WriteFileArgs are the arguments of write_file.
type WriteFileArgs struct {
	Path    string `json:"path" jsonschema:"the file to write; relative paths start at the shell's current directory; missing parent directories are created"`
	Content string `json:"content" jsonschema:"the complete new content of the file (it replaces what was there)"`
}

// WriteFileResult says what write_file did.
type WriteFileResult struct {
	Path    string `json:"path"`
	Bytes   int    `json:"bytes"`
	StateID string `json:"state_id"`
	Turn    int    `json:"turn"`
	Warning string `json:"warning,omitempty"`
}

// WriteFile replaces a file's content.
func (s *Session) WriteFile(ctx context.Context, a WriteFileArgs) (*WriteFileResult, error) {
	label := fmt.Sprintf("write_file %s (%d bytes)", a.Path, len(a.Content))
	r, err := s.file(ctx, label, coordinator.Action{Tool: state.ToolWriteFile, Path: a.Path, Content: []byte(a.Content),
		Timeout: 60 * time.Second, MaxOutput: 4 << 10})
	if err != nil {
		return nil, err
	}
	return &WriteFileResult{Path: a.Path, Bytes: len(a.Content), StateID: r.StateID, Turn: r.Turn, Warning: r.warning}, nil
}

// ListStatesArgs are the arguments of list_states.
type ListStatesArgs struct {
	Limit int `json:"limit,omitempty" jsonschema:"how many of the most recent states to list (default 20)"`
}

// StateInfo is one state as list_states shows it.
type StateInfo struct {
	Entry
	// Restorable: rollback can return to it.
	Restorable bool `json:"restorable"`
	// Current: the environment is in this state now.
	Current bool `json:"current,omitempty"`
	// Undone: a rollback went back past it (it is off the current
	// history, yet still restorable).
	Undone bool   `json:"undone,omitempty"`
	Note   string `json:"note,omitempty"`
}

// ListStatesResult is the environment's recent states, oldest first.
type ListStatesResult struct {
	EnvID   string      `json:"env_id"`
	Current string      `json:"current_state_id"`
	Turn    int         `json:"turn"`
	States  []StateInfo `json:"states"`
	// Older counts the states left out by the limit.
	Older int `json:"older,omitempty"`
}

// settle waits for the environment's background checkpoint, so that the
// newest state is either committed or known to have failed (in which
// case the coordinator checkpointed the changes it held again, and the
// log's newest entry moves to that state). The caller holds the lock.
func (s *Session) settle(ctx context.Context) error {
	sid, remade, err := s.t.c.Head(ctx, s.id)
	if err != nil {
		return coordError("wait for checkpoint", err)
	}
	if remade {
		s.t.log.Warn("background checkpoint failed; checkpointed again", slog.String("env", s.id), slog.String("state", sid))
		last := s.h.last()
		last.StateID, last.Time = sid, time.Now()
		s.h.add(last)
	}
	return nil
}

// lineage is the env's head and the set of states on its current
// history.
func (s *Session) lineage(ctx context.Context) (string, map[string]bool, error) {
	head, line, _, err := s.t.c.States(ctx, s.id)
	if err != nil {
		return "", nil, coordError("env "+s.id, err)
	}
	set := map[string]bool{}
	for _, st := range line {
		set[st.ID] = true
	}
	return head, set, nil
}

// ListStates lists the environment's recent states with what made them.
func (s *Session) ListStates(ctx context.Context, a ListStatesArgs) (*ListStatesResult, error) {
	if a.Limit < 0 {
		return nil, fmt.Errorf("%w: limit must be positive, got %d", ErrBadArgument, a.Limit)
	}
	if a.Limit == 0 {
		a.Limit = 20
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.settle(ctx); err != nil {
		return nil, err
	}
	head, onPath, err := s.lineage(ctx)
	if err != nil {
		return nil, err
	}
	turn, err := s.t.c.EpisodeTurn(s.id)
	if err != nil {
		return nil, coordError("env "+s.id, err)
	}
	out := &ListStatesResult{EnvID: s.id, Current: head, Turn: turn}
	// One row per state: a state reached again (e.g. re-made after a
	// failed checkpoint) shows its newest entry.
	seen := map[string]bool{}
	var rows []StateInfo
	for i := len(s.h.entries) - 1; i >= 0; i-- {
		en := s.h.entries[i]
		if seen[en.StateID] {
			continue
		}
		seen[en.StateID] = true
		si := StateInfo{Entry: en, Current: en.StateID == head, Undone: !onPath[en.StateID]}
		if s.t.c.Committed(en.StateID) {
			si.Restorable = true
		} else {
			si.Note = "its checkpoint is gone or failed: cannot be restored"
		}
		rows = append(rows, si)
	}
	slices.Reverse(rows)
	if len(rows) > a.Limit {
		out.Older = len(rows) - a.Limit
		rows = rows[len(rows)-a.Limit:]
	}
	out.States = rows
	return out, nil
}

// RollbackArgs are the arguments of rollback.
type RollbackArgs struct {
	StateID string `json:"state_id" jsonschema:"a state id from list_states (or one returned by bash/write_file)"`
}

// RollbackResult says what was restored.
type RollbackResult struct {
	StateID string `json:"state_id"`
	Turn    int    `json:"turn"`
	// Tool and Command produced the restored state ("" when it predates
	// these tools).
	Tool      string  `json:"tool,omitempty"`
	Command   string  `json:"command"`
	Cwd       string  `json:"cwd,omitempty"`
	DurationS float64 `json:"duration_s"`
	// Undone counts the states of the current history the rollback went
	// back past (they stay restorable).
	Undone int `json:"undone_states"`
}

// Rollback returns the environment to one of its states: files, processes
// and shell state. It is the coordinator's rollback turn (the rule of which
// states the env may address lives there: its current history or any
// state it made, which covers every state in the tools' log).
func (s *Session) Rollback(ctx context.Context, a RollbackArgs) (*RollbackResult, error) {
	if a.StateID == "" {
		return nil, fmt.Errorf("%w: state_id is empty: pass one from list_states", ErrBadArgument)
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	// The head has no lineage in the manifest until its background
	// checkpoint commits: settle it before asking which states are on the
	// current history (the ones a rollback undoes).
	if err := s.settle(ctx); err != nil {
		return nil, err
	}
	_, onPath, _ := s.lineage(ctx)
	r, err := s.t.c.Turn(ctx, s.id, coordinator.Action{Tool: state.ToolRollback, StateID: a.StateID})
	if err != nil {
		return nil, coordError("rollback", err)
	}
	if r.Rejected != "" {
		return nil, fmt.Errorf("%w: %s; call list_states for the ones you can restore", state.ErrUnknownState,
			strings.TrimPrefix(r.Rejected, "rollback: "))
	}
	// Newer states on the current history are the ones undone.
	undone := 0
	for _, en := range s.h.entries {
		if onPath[en.StateID] && en.Turn > r.Turn {
			undone++
		}
	}
	out := &RollbackResult{StateID: r.Restored, Turn: r.Turn, Cwd: r.Result.Cwd, Undone: undone, DurationS: r.Result.Duration.Seconds()}
	if en, ok := s.h.find(r.Restored); ok {
		out.Tool, out.Command = en.Tool, en.Command
	} else {
		out.Command = "(made before the agent tools were attached)"
	}
	return out, nil
}

// ForkTryArgs are the arguments of fork_try.
type ForkTryArgs struct {
	Cmd      string  `json:"cmd" jsonschema:"the shell command line to try on a throwaway copy of the environment"`
	TimeoutS float64 `json:"timeout_s,omitempty" jsonschema:"seconds before the command is killed (default: the task's command timeout, else 60)"`
}

// maxChanges bounds the change list of fork_try.
const maxChanges = 200

// ForkTryResult is what a command did on a throwaway branch.
type ForkTryResult struct {
	ExitCode  int     `json:"exit_code"`
	Stdout    string  `json:"stdout"`
	Stderr    string  `json:"stderr"`
	TimedOut  bool    `json:"timed_out,omitempty"`
	Truncated bool    `json:"truncated,omitempty"`
	Cwd       string  `json:"cwd"`
	DurationS float64 `json:"duration_s"`
	// Changes lists the files the command added, modified or deleted
	// (nil with ChangesNote when they could not be listed).
	Changes          []coordinator.FileChange `json:"changes"`
	ChangesTruncated bool                     `json:"changes_truncated,omitempty"`
	ChangesNote      string                   `json:"changes_note,omitempty"`
	// FromState is the state the branch started from (the environment's
	// current one, which fork_try leaves as it is).
	FromState string `json:"from_state"`
	// BranchS, ChangesS and TotalS time the parts of the call.
	BranchS  float64 `json:"branch_s"`
	ChangesS float64 `json:"changes_s"`
	TotalS   float64 `json:"total_s"`
}

// ForkTry runs a command on a throwaway branch of the environment and
// reports its output and the files it changed; the environment itself is
// untouched.
func (s *Session) ForkTry(ctx context.Context, a ForkTryArgs) (*ForkTryResult, error) {
	if strings.TrimSpace(a.Cmd) == "" {
		return nil, fmt.Errorf("%w: cmd is empty: pass the command line to try", ErrBadArgument)
	}
	asked, err := timeout(a.TimeoutS)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	tr, err := s.t.c.ForkTry(ctx, s.id, coordinator.Action{Cmd: a.Cmd, Timeout: asked, MaxOutput: s.t.o.MaxOutput})
	if err != nil {
		return nil, coordError("fork_try", err)
	}
	res := tr.Result
	out := &ForkTryResult{ExitCode: res.ExitCode, Stdout: string(res.Stdout), Stderr: string(res.Stderr), TimedOut: res.TimedOut,
		Truncated: res.Truncated, Cwd: res.Cwd, DurationS: res.Duration.Seconds(), FromState: tr.FromState,
		BranchS: tr.Branched.Sub(start).Seconds(), ChangesS: tr.Listed.Sub(tr.Ran).Seconds(), TotalS: tr.Listed.Sub(start).Seconds()}
	switch {
	case tr.ChangesErr != nil:
		out.ChangesNote = "cannot list changed files: " + tr.ChangesErr.Error()
	case len(tr.Changes) > maxChanges:
		out.Changes, out.ChangesTruncated, out.ChangesNote = tr.Changes[:maxChanges], true, "more not shown"
	default:
		out.Changes = tr.Changes
	}
	return out, nil
}
