package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/state"
)

// Checkpoint takes a full checkpoint of env now (high priority) and
// returns its state id; the caller holds the env's ticket. A failure of
// the background checkpoint before it is not this one's: the next turn
// reports it.
func (c *Coordinator) Checkpoint(ctx context.Context, envID string) (string, error) {
	env, m, err := c.lookup(ctx, envID)
	if err != nil {
		return "", err
	}
	if _, err := c.e.WaitCheckpoint(ctx, env); err != nil {
		return "", err
	}
	if ckErr := env.TakeCheckpointError(); ckErr != nil {
		c.mu.Lock()
		m.failed = ckErr
		c.mu.Unlock()
	}
	c.observePending(m)
	t := time.Now()
	before := env.Head()
	sid, err := c.e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		return "", err
	}
	c.trailHeadMoved(m, before)
	c.o.Hooks.StateMade(env.ID, sid)
	c.m.checkpoint.WithLabelValues("forced").Observe(time.Since(t).Seconds())
	c.m.checkpoints.WithLabelValues(string(state.Full)).Inc()
	return sid, nil
}

// BranchRequest names the source of a branch: an env handed out (its
// current state) or a state id, and how many children to make.
type BranchRequest struct {
	EnvID, StateID string
	N              int
	// Ephemeral: as ResetRequest's, for the children. It is the caller's
	// to say (whoever asks owns the children), never inherited: a protocol
	// client's children of an MCP session's env are served envs, adopted
	// again after a crash.
	Ephemeral bool
}

// BranchResult is what Branch made. Children[i] is nil where Errors[i]
// says why.
type BranchResult struct {
	State    string
	Children []*branch.Env
	Errors   []error
	Took     time.Duration
	// Task and Turn are what the children inherited: the task and the
	// turn of the episode at State.
	Task TaskInfo
	Turn int
}

// Branch makes N envs whose state equals the source's and hands them
// out. Children inherit the task, the seed and the episode's turn base of
// the env they come from (for a state id: of the env that made it while
// it is open, else the task whose prepared state it descends from), and
// have it as origin when it is an env handed out (promote hands their
// state back to it). They are ephemeral only if req says so. The caller
// holds the source env's ticket.
func (c *Coordinator) Branch(ctx context.Context, req BranchRequest) (*BranchResult, error) {
	if (req.EnvID == "") == (req.StateID == "") {
		return nil, fmt.Errorf("%w: branch needs exactly one of env_id and state_id", state.ErrInvalidParams)
	}
	if req.N < 1 {
		return nil, fmt.Errorf("%w: n: want at least 1, got %d", state.ErrInvalidParams, req.N)
	}
	if req.N > c.o.MaxEnvs {
		// No wait can make room for more children than the server may
		// ever hold: out of range, not a retryable too_many_envs.
		return nil, fmt.Errorf("%w: n: want at most %d (the server's max_envs), got %d", state.ErrInvalidParams, c.o.MaxEnvs, req.N)
	}
	src := branch.Source{State: req.StateID}
	var parent *entry
	if req.EnvID != "" {
		env, m, err := c.lookup(ctx, req.EnvID)
		if err != nil {
			return nil, err
		}
		c.observePending(m)
		src, parent = branch.Source{Env: env}, m
	} else {
		if err := c.settle(ctx, req.StateID); err != nil {
			return nil, err
		}
		if err := c.ownState(ctx, req.StateID); err != nil {
			return nil, err
		}
		st, err := c.e.State(req.StateID)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		parent = c.envs[st.Env]
		c.mu.Unlock()
	}
	ticket, err := c.admit(ctx, ClassBranch)
	if err != nil {
		return nil, err
	}
	defer ticket.Done()
	if err := c.reserve(req.N); err != nil {
		return nil, err
	}
	defer c.unreserve(req.N)
	var before string
	if src.Env != nil {
		before = src.Env.Head()
	}
	res, err := c.e.Branch(ctx, src, req.N)
	if src.Env != nil {
		c.trailHeadMoved(parent, before)
	}
	if err != nil {
		return nil, c.released(req.StateID, err)
	}
	c.m.branch.Observe(res.Took.Seconds())
	if src.Env != nil {
		c.o.Hooks.StateMade(src.Env.ID, res.State)
	}
	var (
		task TaskInfo
		seed int64
		base int
	)
	if parent != nil {
		task, seed, base = parent.task, parent.seed, parent.base
	} else if t, ok := c.tasks.TaskOfState(res.State); ok {
		task = t
		// The episode's own limit (reset's options.max_turns), as
		// recorded on the env that made the state, not the task's.
		if st, err := c.e.State(res.State); err == nil {
			if l, ok := c.e.Labels(st.Env); ok && l[labelServed] == "1" && l[labelMaxTurns] != "" {
				task.MaxTurns, _ = strconv.Atoi(l[labelMaxTurns])
			}
		}
	} else if l, ok := c.importedLabels(res.State); ok {
		// A state shipped from another node, where its env was handed
		// out: its children inherit as they would there
		// (docs/cluster.md, "Branch children on other nodes").
		task, base, seed = fromLabels(l)
	}
	owner := c.childTenant(ctx, parent, req.StateID)
	out := &BranchResult{State: res.State, Children: res.Children, Errors: res.Errors, Took: res.Took, Task: task}
	failed := 0
	for i, ch := range res.Children {
		if res.Errors[i] != nil || ch == nil {
			if res.Errors[i] == nil {
				res.Errors[i] = errors.New("no env")
			}
			res.Errors[i] = c.released(res.State, res.Errors[i])
			out.Children[i] = nil
			failed++
			continue
		}
		if src.Env != nil {
			ch.Origin = src.Env.ID
		} else if !c.Has(ch.Origin) {
			// A state of an env not handed out (a task's template) or
			// closed since: there is no env to promote into.
			ch.Origin = ""
		}
		cm := c.register(ch, task, seed, base, req.Ephemeral, owner)
		if src.Env != nil {
			c.trailBranched(cm, parent)
		}
		out.Turn = ch.Turn() - base
	}
	if failed == req.N {
		return nil, res.Errors[0]
	}
	ev := Event{Type: EventBranch, Env: req.EnvID, Task: task.Name, State: res.State}
	for _, ch := range out.Children {
		if ch != nil {
			ev.Children = append(ev.Children, ch.ID)
		}
	}
	c.publish(ev)
	return out, nil
}

// Promote adopts child's current state as the state of the env it was
// branched from and closes child; it returns the origin's id and the
// adopted state. The caller holds both envs' tickets.
func (c *Coordinator) Promote(ctx context.Context, envID string) (origin, sid string, err error) {
	child, m, err := c.lookup(ctx, envID)
	if err != nil {
		return "", "", err
	}
	c.observePending(m)
	origin = child.Origin
	if origin == "" {
		return "", "", fmt.Errorf("%w: env %s was not branched from an env: nothing to promote it into", state.ErrInvalid, child.ID)
	}
	_, om, err := c.lookup(ctx, origin)
	if err != nil {
		return "", "", fmt.Errorf("%w: origin env %s of %s is not open", state.ErrInvalid, origin, child.ID)
	}
	before := child.Head()
	if sid, err = c.e.Promote(ctx, child); err != nil {
		return "", "", err
	}
	c.trailPromoted(om, m, before, sid)
	c.forget(child.ID)
	c.publish(Event{Type: EventPromote, Env: origin, Task: m.task.Name, State: sid, Child: child.ID})
	c.o.Hooks.StateMade(origin, sid)
	return origin, sid, nil
}

// Discard throws an env away: it is closed and its states released (a
// rejected draft; an env lost in a restart is forgotten). Any env, a
// reset's too: it is CloseEnv but for the event (docs/protocol.md). The
// caller holds the env's ticket.
func (c *Coordinator) Discard(ctx context.Context, envID string) error {
	return c.discard(ctx, envID, EventDiscard)
}

// discard is Discard and CloseEnv, which differ only in the event fired.
func (c *Coordinator) discard(ctx context.Context, envID, event string) error {
	if c.dropLost(envID) {
		// Lost in a restart: forgetting it releases its states.
		return c.e.ForgetLost(ctx, envID)
	}
	env, _, err := c.lookup(ctx, envID)
	if err != nil {
		return err
	}
	return c.close(ctx, env, event)
}

// close closes env in the engine and forgets it once the engine no longer
// has it (its close can fail after that, destroying the sandbox): never
// while it is open, so an env no longer listed (Envs) is closed.
// The feed reports it as event (EventDiscard, EventClose or EventFinish).
func (c *Coordinator) close(ctx context.Context, env *branch.Env, event string, opts ...func(*Event)) error {
	task, _ := c.Task(env.ID)
	err := c.e.CloseEnv(ctx, env)
	if _, gone := c.e.Env(env.ID); gone != nil {
		c.forget(env.ID)
		ev := Event{Type: event, Env: env.ID, Task: task.Name}
		for _, o := range opts {
			o(&ev)
		}
		c.publish(ev)
	}
	return err
}

// CloseEnv ends an env handed out. The caller holds the env's ticket.
func (c *Coordinator) CloseEnv(ctx context.Context, envID string) error {
	// Discard and close are one operation today: the engine releases the
	// states only a closed env held.
	return c.discard(ctx, envID, EventClose)
}

// Evaluate runs the verifier of env's task on its current state (the
// task pool's trusted grader, or a fork for a task that keeps the agent's
// processes); env itself is untouched. With finish the episode is over:
// env is closed once evaluated (also when the evaluation failed because
// of the env or the task; not when the server could not run it), and the
// feed reports EventFinish instead of EventEvaluate. The caller holds the
// env's ticket.
func (c *Coordinator) Evaluate(ctx context.Context, envID string, finish bool) (Evaluation, error) {
	env, m, err := c.lookup(ctx, envID)
	if err != nil {
		return Evaluation{}, err
	}
	ticket, err := c.admit(ctx, ClassEvaluate)
	if err != nil {
		return Evaluation{}, err
	}
	defer ticket.Done()
	admitted := time.Now()
	c.observePending(m)
	ev, err := c.tasks.Evaluate(ctx, env, m.task, m.seed)
	if err != nil {
		if finish && (errors.Is(err, state.ErrVerifierOutput) || errors.Is(err, state.ErrAgent) || errors.Is(err, state.ErrNoVerifier)) {
			// Because of the task or the agent's own state: the episode
			// is over all the same.
			c.close(ctx, env, EventFinish)
		}
		return Evaluation{}, err
	}
	m.used.Store(time.Now().UnixNano())
	c.m.evaluate.Observe(time.Since(admitted).Seconds())
	if ev.Details == nil {
		ev.Details = map[string]any{}
	}
	reward := ev.Reward
	if finish {
		if err := c.close(ctx, env, EventFinish, withReward(reward)); err != nil {
			return Evaluation{}, fmt.Errorf("close env %s after its evaluation (reward %v): %w", envID, reward, err)
		}
		return ev, nil
	}
	task, _ := c.Task(env.ID)
	c.publish(Event{Type: EventEvaluate, Env: env.ID, Task: task.Name, State: stateOf(ev), Turn: env.Turn(), Reward: &reward})
	return ev, nil
}

// stateOf is the state an evaluation scored, as its details name it.
func stateOf(ev Evaluation) string {
	s, _ := ev.Details["state_id"].(string)
	return s
}

// withReward sets a closing event's reward.
func withReward(r float64) func(*Event) { return func(e *Event) { e.Reward = &r } }

// Head returns env's head as a committed state, waiting (at high
// priority) for its background checkpoint; when that failed, the changes
// it held are checkpointed again (remade). The caller holds the env's
// ticket.
func (c *Coordinator) Head(ctx context.Context, envID string) (head string, remade bool, err error) {
	env, m, err := c.lookup(ctx, envID)
	if err != nil {
		return "", false, err
	}
	if _, err := c.e.WaitCheckpoint(ctx, env); err != nil {
		return "", false, err
	}
	// When it failed, the env has changes no state holds: the engine makes
	// the checkpoint below full (Engine.CheckpointAsync's rule); else it is
	// the head as it is.
	remade = c.takeFailure(env, m) != nil
	if head, err = c.e.Checkpoint(ctx, env, state.None); err != nil {
		return "", false, err
	}
	c.observePending(m)
	return head, remade, nil
}

// StateInfo is one state of an env's lineage.
type StateInfo struct {
	ID, Parent, Env string
	Turn            int // since the env's episode began
	Kind            state.Kind
	Created         time.Time
	// Bytes is what the state's own artifacts take (Engine.StateBytes).
	Bytes int64
}

// States returns env's committed head, its lineage, oldest first, and
// the bytes the lineage's artifacts take (each once). The caller holds the
// env's ticket.
func (c *Coordinator) States(ctx context.Context, envID string) (string, []StateInfo, int64, error) {
	env, m, err := c.lookup(ctx, envID)
	if err != nil {
		return "", nil, 0, err
	}
	head := env.Head()
	l, err := c.e.Lineage(head)
	if errors.Is(err, state.ErrUnknownState) {
		// The head's checkpoint is still running: wait for it. (A failure
		// the head already survived stays for the next turn to report.)
		if head, _, err = c.Head(ctx, envID); err != nil {
			return "", nil, 0, err
		}
		l, err = c.e.Lineage(head)
	}
	if err != nil {
		return "", nil, 0, err
	}
	c.observePending(m)
	base := m.base
	own, total := c.e.StateBytes(l)
	out := make([]StateInfo, 0, len(l))
	for i, st := range l {
		out = append(out, StateInfo{ID: st.ID, Parent: st.Parent, Env: st.Env, Turn: st.Turn - base, Kind: st.Kind, Created: st.Created, Bytes: own[i]})
	}
	return head, out, total, nil
}

// Release drops states a client will never branch from again (protocol
// release); Pin keeps states until Unpin, through their env's close and
// past its retention (docs/engine.md, "Retention"). Each is all or nothing:
// an unknown id (state.ErrUnknownState) changes none. A state id a step returned
// may be named at once: its checkpoint is waited for first, as for branch.
func (c *Coordinator) Release(ctx context.Context, ids []string) error {
	return c.onStates(ctx, "release", ids, c.e.Release)
}

// Pin: see Release.
func (c *Coordinator) Pin(ctx context.Context, ids []string) error {
	return c.onStates(ctx, "pin", ids, c.e.Pin)
}

// Unpin: see Release.
func (c *Coordinator) Unpin(ctx context.Context, ids []string) error {
	return c.onStates(ctx, "unpin", ids, c.e.Unpin)
}

// Prepare restores n frozen copies of each state ahead of branches from
// it, in the background (branch.Engine.Prepare; docs/engine.md, "Prepared
// copies"); with wait it returns once they are ready. A state id a step
// returned may be named at once: its checkpoint is waited for first, as
// for branch.
func (c *Coordinator) Prepare(ctx context.Context, ids []string, n int, wait bool) (branch.PrepareResult, error) {
	if len(ids) == 0 {
		return branch.PrepareResult{}, fmt.Errorf("%w: state_ids: want at least one", state.ErrInvalidParams)
	}
	for _, id := range ids {
		if id == "" {
			return branch.PrepareResult{}, fmt.Errorf("%w: state_ids: empty id", state.ErrInvalidParams)
		}
		if err := c.settle(ctx, id); err != nil {
			return branch.PrepareResult{}, err
		}
		if err := c.ownState(ctx, id); err != nil {
			return branch.PrepareResult{}, err
		}
	}
	return c.e.Prepare(ctx, ids, n, wait)
}

// onStates runs op (release, pin, unpin) on states. A state of another
// tenant is answered as the first state the engine does not have is
// (manifest: "OP states [IDS]: state ID: not found"), unless one it does
// not have comes first.
func (c *Coordinator) onStates(ctx context.Context, op string, ids []string, f func(...string) error) error {
	if len(ids) == 0 {
		return fmt.Errorf("%w: state_ids: want at least one", state.ErrInvalidParams)
	}
	for _, id := range ids {
		if id == "" {
			return fmt.Errorf("%w: state_ids: empty id", state.ErrInvalidParams)
		}
		if err := c.settle(ctx, id); err != nil {
			return err
		}
	}
	for _, id := range ids {
		if c.foreignState(ctx, id) {
			return fmt.Errorf("%w: %s states %v: state %s: %v", state.ErrUnknownState, op, ids, id, manifest.ErrNotFound)
		}
		if _, err := c.e.State(id); err != nil {
			break // the engine names it
		}
	}
	return f(ids...)
}

// importedLabels are the labels of the env that made state sid when the
// state was shipped here from another node where that env was handed out
// (Engine.ImportedLabels).
func (c *Coordinator) importedLabels(sid string) (map[string]string, bool) {
	st, err := c.e.State(sid)
	if err != nil {
		return nil, false
	}
	l, ok := c.e.ImportedLabels(st.Env)
	return l, ok && l[labelServed] == "1"
}
