package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/shcmd"
	"github.com/arbor-env/arbor/state"
)

// Action is one turn's command.
type Action struct {
	// Tool is state.ToolBash, ToolWriteFile, ToolReadFile or
	// ToolRollback; it labels the metrics.
	Tool string
	Cmd  string // bash
	Path string // write_file, read_file
	// Content is write_file's.
	Content []byte
	// StateID is rollback's target.
	StateID string
	// Timeout bounds the command (0: the task's command timeout, else the
	// coordinator's default); MaxTimeout caps it.
	Timeout time.Duration
	// MaxOutput caps each of stdout and stderr (0: the sandbox's default).
	MaxOutput int
	// ReadOnly: the caller vouches that the command changes nothing, so
	// the turn is checkpointed none without classifying it (unless a
	// failed checkpoint makes the engine take it full).
	ReadOnly bool
}

// command is the shell command of an action.
func (a Action) command() string {
	switch a.Tool {
	case state.ToolWriteFile:
		return shcmd.WriteFile(a.Path, a.Content)
	case state.ToolReadFile:
		return shcmd.ReadFile(a.Path)
	}
	return a.Cmd
}

// TurnResult is what a turn did.
type TurnResult struct {
	Env    *branch.Env
	Task   TaskInfo
	Result *sandbox.Result
	// StateID is the state after the turn (its checkpoint may still run);
	// Kind what that checkpoint captures.
	StateID string
	Kind    state.Kind
	// Turn counts the turns since the episode began.
	Turn int
	// Truncated: the episode reached its task's MaxTurns.
	Truncated bool
	// CheckpointError is the failure of the previous turn's background
	// checkpoint, which made this turn's checkpoint full.
	CheckpointError error
	// VerifyMisses are what VerifySkips found the state lacks.
	VerifyMisses []string
	// Restored is the state a rollback turn restored; Rejected, when set,
	// says why the rollback was refused (the agent's mistake, reported in
	// the observation: Result holds it).
	Restored string
	Rejected string
	// Recovered, on the first operation after a restart restored the env
	// from a crash, says at which state.
	Recovered *Recovered
}

// Turn runs one action in env as one turn: exec, classify, queue the
// checkpoint (the engine makes it full after a failed background
// checkpoint, and the turn reports that failure), verify (VerifySkips),
// count the turn against the task's MaxTurns. It is the only place that
// rule is written; the caller holds the env's ticket.
func (c *Coordinator) Turn(ctx context.Context, envID string, a Action) (*TurnResult, error) {
	start := time.Now()
	env, m, err := c.lookup(ctx, envID)
	if err != nil {
		return nil, err
	}
	// Admission (admission.go) bounds the turns running at once, a
	// rollback's too: a turn that would wait past its bound is busy.
	ticket, err := c.admit(ctx, ClassStep)
	if err != nil {
		return nil, err
	}
	defer ticket.Done()
	if a.Tool == state.ToolRollback {
		return c.rollbackTurn(ctx, env, m, a, start)
	}
	if n := env.Turn() - m.base; m.task.MaxTurns > 0 && n >= m.task.MaxTurns {
		// Gymnasium's rule on every surface (docs/protocol.md, "Episode
		// end"): a truncated episode takes no more steps.
		return nil, state.Errorf(state.ErrInvalid, "the episode is over: env %s is at turn %d, its task's max_turns is %d; reset, roll back to an earlier state, or branch one",
			envID, n, m.task.MaxTurns)
	}
	cmd := a.command()
	// The command runs on its sandbox's CPU, not the server's: past
	// slotHold its slot is given back until it ends (a long command held
	// it, and a few starved every other env's steps:
	// TestLongCommandsDoNotHoldSlots), and taken again, never refused,
	// for the classification and the commit.
	resume := ticket.PauseAfter(slotHold)
	res, err := c.e.Exec(ctx, env, cmd, sandbox.ExecOptions{Timeout: c.commandTimeout(m, a.Timeout), MaxOutput: a.MaxOutput})
	resume()
	if err != nil {
		return nil, fmt.Errorf("step in env %s: %w", envID, revivedError(err, m))
	}
	c.observePending(m)
	out := &TurnResult{Env: env, Task: m.task, Result: res, Recovered: m.takeRecovered()}
	kind := state.None
	if !a.ReadOnly {
		kind = c.classify(ctx, env, cmd)
	}
	parent := env.Head()
	if err := c.commit(env, m, kind, out); err != nil {
		return nil, err
	}
	out.Turn = env.Turn() - m.base
	c.trailTurn(m, a, parent, out, start)
	defer func() { c.noteTurn(m, a, parent, out, time.Since(start)) }()
	switch r := c.o.VerifySkips; {
	case r >= 1:
		if c.skipped(ctx, env, out.Kind, out.StateID) {
			out.VerifyMisses = c.verify(ctx, env, out.StateID)
		}
	case r > 0 && rand.Float64() < r:
		c.verifyLater(envID, env, out.Kind, out.StateID, out.Turn)
	}
	out.Truncated = m.task.MaxTurns > 0 && out.Turn >= m.task.MaxTurns
	c.m.step.WithLabelValues(a.Tool).Observe(time.Since(start).Seconds())
	return out, nil
}

// verify restores sid and compares it with env's live state
// (Engine.Verify), counts the outcome and returns the misses.
func (c *Coordinator) verify(ctx context.Context, env *branch.Env, sid string) []string {
	vctx, cancel := context.WithTimeout(ctx, c.o.InspectTimeout)
	defer cancel()
	v, err := c.e.Verify(vctx, env, sid)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil // cancelled (a client gone, a shutdown): no verdict, no miss
	case err != nil:
		// Not a miss: the check itself could not run (a restore that
		// failed, a file system that stopped answering), reported as
		// such in the turn.
		c.m.verified.WithLabelValues("error").Inc()
		return []string{"verification failed: " + err.Error()}
	case len(v.Misses) > 0:
		c.m.verified.WithLabelValues("miss").Inc()
		return v.Misses
	}
	c.m.verified.WithLabelValues("ok").Inc()
	return nil
}

// skipped reports whether a turn's checkpoint of kind k, state sid, left
// out something verification should check: every kind but full, and a
// full one whose processes are a shell delta rather than a dump (known
// once it committed: this waits for it).
func (c *Coordinator) skipped(ctx context.Context, env *branch.Env, k state.Kind, sid string) bool {
	if k != state.Full {
		return true
	}
	if _, err := c.e.WaitCheckpoint(ctx, env); err != nil {
		return false
	}
	st, err := c.e.State(sid)
	return err == nil && !st.Dumped()
}

// verifyLater verifies a sampled skip in the background (VerifySkips
// below 1). It queues on the env's ticket now, so it runs right after the
// operation in progress and before any later one, while env is still at
// sid; Close waits for it.
func (c *Coordinator) verifyLater(envID string, env *branch.Env, k state.Kind, sid string, turn int) {
	// Counted before Close can wait, or not started at all.
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	t := c.take(envID)
	go func() {
		defer c.wg.Done()
		t.wait()
		defer t.release()
		if c.ctx.Err() != nil || env.Head() != sid || !c.skipped(c.ctx, env, k, sid) {
			return // stopping, closed or moved meanwhile, or nothing skipped
		}
		if misses := c.verify(c.ctx, env, sid); len(misses) > 0 && c.ctx.Err() == nil {
			c.log.Warn("skipped checkpoint verification found a miss", slog.String("env", envID), slog.Int("turn", turn),
				slog.String("state", sid), slog.Any("misses", misses))
		}
	}()
}

// commandTimeout is the timeout of a command in m's env: asked (the
// action's own), else the task's command timeout, else the default;
// capped by MaxTimeout. It is the one home of those defaults.
func (c *Coordinator) commandTimeout(m *entry, asked time.Duration) time.Duration {
	if asked <= 0 {
		asked = m.task.CommandTimeout
	}
	if asked <= 0 {
		asked = c.o.DefaultTimeout
	}
	return min(asked, c.o.MaxTimeout)
}

// OutputCap is the cap of each of a command's stdout and stderr for an
// action's MaxOutput (0: the default), as the sandbox applies it.
func OutputCap(maxOutput int) int { return sandbox.OutputCap(maxOutput) }

// EpisodeTurn is env envID's turn count since its episode began (the
// turn TurnResult and the protocol's info.turn report).
func (c *Coordinator) EpisodeTurn(envID string) (int, error) {
	env, m, err := c.lookup(everyTenant(), envID)
	if err != nil {
		return 0, err
	}
	return env.Turn() - m.base, nil
}

// classify is the one classification entry: the engine's inspector (or
// the test seam). Its failures make the turn full.
func (c *Coordinator) classify(ctx context.Context, env *branch.Env, cmd string) state.Kind {
	ctx, cancel := context.WithTimeout(ctx, c.o.InspectTimeout)
	defer cancel()
	t, err := c.o.Classify(ctx, env, cmd)
	if err != nil {
		c.log.Warn("classify turn", slog.String("env", env.ID), slog.Any("err", err))
		return state.Full
	}
	c.log.Debug("turn classified", slog.String("env", env.ID), slog.String("kind", string(t.Kind)),
		slog.Any("reasons", t.Reasons), slog.Duration("took", t.Took))
	return t.Kind
}

// takeFailure returns (once) the failure of env's last background
// checkpoint: the engine's, or the one WaitTurn took from it.
func (c *Coordinator) takeFailure(env *branch.Env, m *entry) error {
	err := env.TakeCheckpointError()
	c.mu.Lock()
	if err == nil {
		err = m.failed
	}
	m.failed = nil
	c.mu.Unlock()
	return err
}

// commit queues the turn's checkpoint of kind and fills out's StateID,
// Kind and CheckpointError. The engine waits for the previous checkpoint
// and, when that one failed, makes this one full (its rule, in one
// place: Engine.CheckpointAsync); commit reports the failure and the kind
// the engine queued.
func (c *Coordinator) commit(env *branch.Env, m *entry, kind state.Kind, out *TurnResult) error {
	sid, kind, err := c.e.CheckpointAsync(env, kind)
	if err != nil {
		return fmt.Errorf("queue checkpoint of env %s: %w", env.ID, err)
	}
	if ckErr := c.takeFailure(env, m); ckErr != nil {
		out.CheckpointError = ckErr
		c.log.Warn("background checkpoint failed", slog.String("env", env.ID), slog.Any("err", ckErr))
	}
	if kind != state.None {
		m.pending = sid
		c.o.Hooks.StateMade(env.ID, sid)
	}
	c.m.checkpoints.WithLabelValues(string(kind)).Inc()
	out.StateID, out.Kind = sid, kind
	return nil
}

// Boundary is a turn without a command, for callers that see only where
// turns end (the LLM proxy: each LLM request ends the agent's turn): the
// turn is classified and its checkpoint queued by the same rule as Turn's.
// The caller holds the env's ticket; WaitTurn waits for the checkpoint.
func (c *Coordinator) Boundary(ctx context.Context, envID string) (*TurnResult, error) {
	env, m, err := c.lookup(ctx, envID)
	if err != nil {
		return nil, err
	}
	// The previous turn's checkpoint first, as Turn's exec waits for it:
	// the inspector classifies against the state it commits, and its
	// failure is this turn's to report (and makes its checkpoint full).
	if _, err := c.e.WaitCheckpoint(ctx, env); err != nil {
		return nil, err
	}
	c.observePending(m)
	start := time.Now()
	out := &TurnResult{Env: env, Task: m.task}
	kind := c.classify(ctx, env, "")
	if err := ctx.Err(); err != nil {
		// Cancelled (the proxy closes): no checkpoint is queued, whose
		// gate nobody could wait out. The inspector's next classification
		// still sees this turn's changes (it compares with the last
		// checkpoint).
		return nil, err
	}
	parent := env.Head()
	if err := c.commit(env, m, kind, out); err != nil {
		return nil, err
	}
	out.Turn = env.Turn() - m.base
	out.Truncated = m.task.MaxTurns > 0 && out.Turn >= m.task.MaxTurns
	c.trailTurn(m, Action{Tool: "boundary"}, parent, out, start)
	c.noteTurn(m, Action{Tool: "boundary"}, parent, out, time.Since(start))
	return out, nil
}

// WaitTurn waits for env's background checkpoint and reports its failure
// (which also makes the next turn's checkpoint full, and that turn reports
// it too). The caller holds the env's ticket: the failure is taken from
// the engine, which must not race with the next operation taking it.
func (c *Coordinator) WaitTurn(ctx context.Context, envID string) error {
	c.mu.Lock()
	m, ok := c.envs[envID]
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: no open env %q", state.ErrUnknownEnv, envID)
	}
	if _, err := c.e.WaitCheckpoint(ctx, m.env); err != nil {
		return err
	}
	if ckErr := m.env.TakeCheckpointError(); ckErr != nil {
		c.mu.Lock()
		m.failed = ckErr
		c.mu.Unlock()
		return ckErr
	}
	return nil
}

// settle waits until state sid is committed when it is the head of an
// open env whose background checkpoint still runs: a client may branch
// from or roll back to a state id the moment a turn returned it. The
// wait raises the checkpoint's priority. When that checkpoint failed, sid
// never came to be: the answer is an unknown state (a retry cannot
// succeed), and the failure is kept for the env that made it, whose next
// turn reports it (the engine makes that turn full).
func (c *Coordinator) settle(ctx context.Context, sid string) error {
	if _, err := c.e.State(sid); err == nil {
		return nil
	}
	for _, env := range c.e.Envs() {
		if env.Head() != sid || !c.sees(ctx, env.ID) {
			continue
		}
		if _, err := c.e.WaitCheckpoint(ctx, env); err != nil {
			return err
		}
		ckErr := env.TakeCheckpointError()
		if ckErr == nil {
			return nil
		}
		c.mu.Lock()
		if m, ok := c.envs[env.ID]; ok {
			m.failed = ckErr
		}
		c.mu.Unlock()
		return fmt.Errorf("%w: state %s: its checkpoint failed: %w", state.ErrUnknownState, sid, ckErr)
	}
	return nil // unknown: the caller reports it
}

// released words a restore of sid that failed because sid is gone (was
// deleted) as the client's unknown state, not as an infrastructure
// failure. The engine holds a branch's state from its look-up to its
// restores and a rollback looks its state up under the GC lock
// (docs/engine.md, "Retention"), so this is a fallback.
func (c *Coordinator) released(sid string, err error) error {
	if sid == "" || !errors.Is(err, state.ErrRestore) {
		return err
	}
	if _, serr := c.e.State(sid); !errors.Is(serr, state.ErrUnknownState) {
		return err
	}
	return fmt.Errorf("%w: state %s was released while it was being restored: %w", state.ErrUnknownState, sid, err)
}

// Seen reports whether sid is a state env may address: an ancestor of its
// head or any state it made (including ones a rollback left behind).
func (c *Coordinator) Seen(env *branch.Env, sid string) bool {
	if l, err := c.e.Lineage(env.Head()); err == nil {
		for _, st := range l {
			if st.ID == sid {
				return true
			}
		}
	}
	if sts, err := c.e.States(env.ID); err == nil {
		for _, st := range sts {
			if st.ID == sid {
				return true
			}
		}
	}
	return false
}

// Restored is where a rollback left an env.
type Restored struct {
	Env     *branch.Env
	Task    TaskInfo
	StateID string
	Turn    int // since the episode began
	// Recovered: as TurnResult's.
	Recovered *Recovered
}

// Rollback returns env to state sid (files, processes, shell state); the
// caller holds the env's ticket.
func (c *Coordinator) Rollback(ctx context.Context, envID, sid string) (*Restored, error) {
	env, m, err := c.lookup(ctx, envID)
	if err != nil {
		return nil, err
	}
	if sid == "" {
		return nil, fmt.Errorf("%w: state_id: required string is missing", state.ErrInvalidParams)
	}
	if err := c.settle(ctx, sid); err != nil {
		return nil, err
	}
	if err := c.ownState(ctx, sid); err != nil {
		return nil, err
	}
	if err := c.sameLineage(env, m, sid); err != nil {
		return nil, err
	}
	return c.restore(ctx, env, m, sid)
}

// sameLineage refuses a rollback of env into sid when sid is a state of
// another task's lineage (or, for an env without a task, of another
// image's): env would hold that task's files while it still names its
// own task, whose verifier would grade them. States of the env's own
// lineage and of its relatives of the same task (branches, closed
// siblings) pass; so does a state whose task cannot be told (then only
// the image is compared).
func (c *Coordinator) sameLineage(env *branch.Env, m *entry, sid string) error {
	t, image, taskKnown := c.stateTask(sid)
	if image == "" {
		return nil // nothing known of it: the engine's restore decides
	}
	if taskKnown && t.Name != m.task.Name {
		return state.Errorf(state.ErrInvalid, "rollback: state %s is of %s, env %s is of %s: an env rolls back only to states of its own task (branch the state for an env of %s)",
			sid, lineageName(t.Name, image), env.ID, lineageName(m.task.Name, env.Image), lineageName(t.Name, image))
	}
	if taskKnown && t.Name != "" {
		return nil // the same task, whatever its image is called
	}
	if image != env.Image {
		return state.Errorf(state.ErrInvalid, "rollback: state %s is of %s, env %s is of %s: an env rolls back only to states of its own image (branch the state for an env of it)",
			sid, lineageName(t.Name, image), env.ID, lineageName(m.task.Name, env.Image))
	}
	return nil
}

// lineageName says what a lineage is of: a task, else a bare image.
func lineageName(task, image string) string {
	if task != "" {
		return fmt.Sprintf("task %q", task)
	}
	return fmt.Sprintf("image %q (no task)", image)
}

// stateTask is what the lineage of sid is of: the task (Name "" for an
// env without one) and the image of the env handed out that made it,
// else the task whose prepared state it descends from, else the labels
// of an env of another node that made it; taskKnown is false when only
// the image of the env that made it is known (image "": not even that).
func (c *Coordinator) stateTask(sid string) (t TaskInfo, image string, taskKnown bool) {
	st, err := c.e.State(sid)
	if err != nil {
		return TaskInfo{}, "", false
	}
	c.mu.Lock()
	m := c.envs[st.Env]
	c.mu.Unlock()
	if m != nil {
		return m.task, m.env.Image, true
	}
	if t, ok := c.tasks.TaskOfState(sid); ok {
		return t, t.Image, true
	}
	if l, ok := c.importedLabels(sid); ok {
		t, _, _ := fromLabels(l)
		return t, t.Image, true
	}
	if env, err := c.e.Env(st.Env); err == nil {
		return TaskInfo{}, env.Image, false
	}
	recs, err := c.e.EnvRecords()
	if err != nil {
		return TaskInfo{}, "", false
	}
	for _, r := range recs {
		if r.ID == st.Env {
			return TaskInfo{}, r.Image, false
		}
	}
	return TaskInfo{}, "", false
}

func (c *Coordinator) restore(ctx context.Context, env *branch.Env, m *entry, sid string) (*Restored, error) {
	t := time.Now()
	if err := c.e.Rollback(ctx, env, sid); err != nil {
		return nil, c.released(sid, err)
	}
	c.m.restore.Observe(time.Since(t).Seconds())
	c.observePending(m)
	c.takeFailure(env, m) // that state is gone with the sandbox that made it
	c.trailMoved(m)
	r := &Restored{Env: env, Task: m.task, StateID: sid, Turn: env.Turn() - m.base, Recovered: m.takeRecovered()}
	c.publish(Event{Type: EventRollback, Env: env.ID, Task: m.task.Name, State: sid, Turn: r.Turn})
	return r, nil
}

// rollbackTurn is the rollback tool: the agent's own rollback. A state
// the agent has not seen is its mistake, reported in the result
// (Rejected); a restore that fails is an infrastructure error.
func (c *Coordinator) rollbackTurn(ctx context.Context, env *branch.Env, m *entry, a Action, start time.Time) (*TurnResult, error) {
	out := &TurnResult{Env: env, Task: m.task, Kind: state.None}
	reject := func(why string) (*TurnResult, error) {
		out.Rejected = why
		out.Result = &sandbox.Result{Stderr: []byte(out.Rejected + "\n"), ExitCode: 2}
		out.StateID, out.Turn = env.Head(), env.Turn()-m.base
		return out, nil
	}
	if err := c.settle(ctx, a.StateID); errors.Is(err, state.ErrUnknownState) {
		return reject("rollback: " + err.Error())
	} else if err != nil {
		return nil, err
	}
	// The env's own head has no lineage in the manifest until its
	// background checkpoint commits: wait for it (the gate the rollback
	// takes anyway) before asking which states the env may address.
	if _, err := c.e.WaitCheckpoint(ctx, env); err != nil {
		return nil, err
	}
	if _, err := c.e.State(a.StateID); err != nil || !c.Seen(env, a.StateID) {
		return reject(fmt.Sprintf("rollback: %s is not a state of this environment's history", a.StateID))
	}
	r, err := c.restore(ctx, env, m, a.StateID)
	if err != nil {
		return nil, err
	}
	out.StateID, out.Restored, out.Turn, out.Recovered = r.StateID, r.StateID, r.Turn, r.Recovered
	msg := fmt.Sprintf("rolled back to state %s (turn %d): files, processes and shell state are as they were then\n", a.StateID, r.Turn)
	out.Result = &sandbox.Result{Stdout: []byte(msg)}
	// The shell's working directory, read without counting a turn.
	if res, err := env.Sandbox().Exec(ctx, "pwd", sandbox.ExecOptions{Timeout: 5 * time.Second}); err == nil {
		out.Result.Cwd = res.Cwd
	}
	out.Result.Duration = time.Since(start)
	out.Truncated = m.task.MaxTurns > 0 && out.Turn >= m.task.MaxTurns
	c.m.step.WithLabelValues(a.Tool).Observe(out.Result.Duration.Seconds())
	return out, nil
}
