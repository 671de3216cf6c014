package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/coordinator/trail"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// Trajectories: every turn's action and observation is recorded with the
// state it led to (package trail), so that protocol trajectory can answer
// the path from the root to any state the engine holds, or to an open
// env's head (docs/protocol.md, "trajectory").
//
// A state's record is the segment of turns from its parent to it: the
// turns that took no checkpoint (kind none, which return the head's id
// again) since the parent, then the turn that made it. The turns an env
// ran since its head state that took no checkpoint are kept with the env
// (pendingTrail) until its next state takes them; an env branched from an
// env inherits them, one branched from a state id does not (the path to a
// state ends with the turn that made it). A rollback leaves the env at the
// path of the state it restored.

// defaultTrajectoryOutput is what a turn's record keeps of each of
// stdout, stderr, a bash command and a write_file content when
// Options.TrajectoryOutput is 0: the sandbox's default output cap, so a
// step with the default max_output is recorded as it was returned.
const defaultTrajectoryOutput = 256 << 10

// trailSweepEvery is how often the records of states the engine no longer
// holds are deleted.
const trailSweepEvery = time.Minute

// envTrail is what an env keeps of its turns that no state's record
// holds yet. It is touched only by operations holding the env's ticket.
type envTrail struct {
	// loose are the turns since the env's head state that took no
	// checkpoint.
	loose []trail.Turn
	// made is the newest state whose record this env wrote, madeParent
	// its parent and madeTurns its segment: while made's checkpoint may
	// still fail. When it failed the engine puts the env back at
	// madeParent and the next state holds made's changes, so its turns
	// go to that state's record.
	made, madeParent string
	madeTurns        []trail.Turn
}

// openTrail opens the trajectory records: at Options.Trajectories, else
// in a temporary directory removed at Close.
func (c *Coordinator) openTrail() error {
	path := c.o.Trajectories
	if path == "" {
		dir, err := os.MkdirTemp("", "arbor-trail-")
		if err != nil {
			return fmt.Errorf("make trajectory dir: %w", err)
		}
		c.trailTmp, path = dir, filepath.Join(dir, "trajectories.db")
	}
	s, err := trail.Open(path)
	if err != nil {
		if c.trailTmp != "" {
			os.RemoveAll(c.trailTmp)
		}
		return err
	}
	c.trail = s
	c.wg.Add(1)
	go c.every(trailSweepEvery, func() { c.sweepTrail() })
	return nil
}

// closeTrail closes the records (after the sweeper stopped).
func (c *Coordinator) closeTrail() {
	if c.trail == nil {
		return
	}
	if err := c.trail.Close(); err != nil {
		c.log.Warn("close trajectories", slog.Any("err", err))
	}
	if c.trailTmp != "" {
		os.RemoveAll(c.trailTmp)
	}
}

// sweepTrail deletes the records of states the engine no longer holds.
// A state whose checkpoint is still running is an env's head: the heads
// are read after the records were listed, so a record written before
// the listing finds its state committed or still the head, never
// neither unless its checkpoint failed.
func (c *Coordinator) sweepTrail() int {
	var heads map[string]bool
	n, err := c.trail.Sweep(func(sid string) bool {
		if heads == nil {
			heads = map[string]bool{}
			for _, env := range c.e.Envs() {
				heads[env.Head()] = true
			}
		}
		if heads[sid] {
			return true
		}
		_, err := c.e.State(sid)
		return !errors.Is(err, state.ErrUnknownState)
	})
	if err != nil {
		c.log.Warn("sweep trajectories", slog.Any("err", err))
	}
	return n
}

func (c *Coordinator) trajectoryOutput() int {
	if c.o.TrajectoryOutput > 0 {
		return c.o.TrajectoryOutput
	}
	return defaultTrajectoryOutput
}

// Committed reports whether state sid is in the engine's records.
func (c *Coordinator) Committed(sid string) bool {
	_, err := c.e.State(sid)
	return err == nil
}

// pendingTrail is the turns of m's env that no state's record holds and
// that lead on from head: a failed checkpoint's (made's, when the engine
// put the env back at its parent head) and the loose ones at head.
func (c *Coordinator) pendingTrail(m *entry, head string) []trail.Turn {
	t := &m.trail
	var out []trail.Turn
	if t.made != "" && t.made != head && t.madeParent == head && !c.Committed(t.made) {
		out = append(out, t.madeTurns...)
	}
	for _, x := range t.loose {
		// A revived env went back to its last committed state: turns at
		// another head are not on its path any more.
		if x.State == head {
			out = append(out, x)
		}
	}
	return out
}

// trailState records the segment of state sid, which m's env just made
// on top of parent: its pending turns, then last when a turn made it.
func (c *Coordinator) trailState(m *entry, sid, parent string, last *trail.Turn) {
	turns := c.pendingTrail(m, parent)
	if last != nil {
		turns = append(turns, *last)
	}
	if err := c.trail.PutSegment(sid, trail.Segment{Parent: parent, Turns: turns}); err != nil {
		c.log.Warn("record trajectory", slog.String("env", m.env.ID), slog.String("state", sid), slog.Any("err", err))
	}
	m.trail = envTrail{made: sid, madeParent: parent, madeTurns: turns}
}

// trailReset marks the state an episode began at: its trajectories
// start there.
func (c *Coordinator) trailReset(sid string) {
	if err := c.trail.PutSegment(sid, trail.Segment{Start: true}); err != nil {
		c.log.Warn("record trajectory start", slog.String("state", sid), slog.Any("err", err))
	}
}

// trailTurn records a turn that ended (Turn, Boundary): with the state it
// made, or with the env while it made none.
func (c *Coordinator) trailTurn(m *entry, a Action, parent string, out *TurnResult, start time.Time) {
	keep := c.trajectoryOutput()
	rec := trail.Turn{Turn: out.Turn, Env: out.Env.ID, State: out.StateID, Parent: parent, Kind: string(out.Kind),
		Action:  trail.Action{Tool: a.Tool, Path: a.Path, StateID: a.StateID, TimeoutS: a.Timeout.Seconds(), MaxOutput: a.MaxOutput},
		Started: start, StepS: time.Since(start).Seconds()}
	var cut1, cut2 bool
	rec.Action.Cmd, cut1 = trail.Cut(a.Cmd, keep)
	rec.Action.Content, cut2 = trail.Cut(a.Content, keep)
	rec.Action.Cut = cut1 || cut2
	if r := out.Result; r != nil {
		rec.Obs = observed(r, keep)
	}
	if out.Kind == state.None && out.StateID == parent {
		m.trail.loose = append(m.trail.loose, rec)
		return
	}
	c.trailState(m, out.StateID, parent, &rec)
}

// observed is what a turn's record keeps of its result.
func observed(r *sandbox.Result, keep int) trail.Obs {
	o := trail.Obs{ExitCode: r.ExitCode, TimedOut: r.TimedOut, Truncated: r.Truncated, Cwd: r.Cwd, DurationS: r.Duration.Seconds(),
		StdoutBytes: r.StdoutBytes, StderrBytes: r.StderrBytes, ShellRestarted: r.ShellRestarted}
	var cut1, cut2 bool
	o.Stdout, cut1 = trail.Cut(string(r.Stdout), keep)
	o.Stderr, cut2 = trail.Cut(string(r.Stderr), keep)
	o.Cut = cut1 || cut2
	for _, l := range r.Limits {
		o.Limits = append(o.Limits, l.String())
	}
	return o
}

// trailMoved records that m's env was moved to state sid whole (a
// rollback, a promote into it): its path is sid's.
func (c *Coordinator) trailMoved(m *entry) {
	m.trail = envTrail{}
}

// trailBranched gives a child the pending turns of src, the env it was
// branched from (nil: a state id), when it is at src's head.
func (c *Coordinator) trailBranched(child, src *entry) {
	if src == nil || child.env.Head() != src.env.Head() {
		return
	}
	child.trail = envTrail{loose: slices.Clone(c.pendingTrail(src, src.env.Head()))}
}

// trailHeadMoved records a state that an operation other than a turn
// made on m's env, whose head was before (a forced checkpoint, a branch
// or an evaluation of an env that changed since its head): the pending
// turns are its segment. Its parent is the engine's (before, unless the
// checkpoint of before failed and the engine put the env back at its
// parent).
func (c *Coordinator) trailHeadMoved(m *entry, before string) {
	head := m.env.Head()
	if head == before || head == "" {
		return
	}
	parent := before
	if st, err := c.e.State(head); err == nil {
		parent = st.Parent
	}
	c.trailState(m, head, parent, nil)
}

// trailPromoted records a promote: child (whose head was before) made
// state sid if it changed since, and origin continues from sid with the
// child's pending turns.
func (c *Coordinator) trailPromoted(origin, child *entry, before, sid string) {
	c.trailHeadMoved(child, before)
	origin.trail = envTrail{loose: slices.Clone(c.pendingTrail(child, sid))}
}

// verdicts records every evaluation's verdict with the state it judged
// (the env's head, or the state_id the verifier's details name).
type verdicts struct {
	Tasks
	c *Coordinator
}

// Evaluate implements Tasks.
func (v verdicts) Evaluate(ctx context.Context, env *branch.Env, task TaskInfo, seed int64) (Evaluation, error) {
	before := env.Head()
	ev, err := v.Tasks.Evaluate(ctx, env, task, seed)
	v.c.mu.Lock()
	m := v.c.envs[env.ID]
	v.c.mu.Unlock()
	if m != nil {
		v.c.trailHeadMoved(m, before)
	}
	if err != nil {
		return ev, err
	}
	sid := env.Head()
	if s, ok := ev.Details["state_id"].(string); ok && s != "" {
		sid = s
	}
	if err := v.c.trail.PutVerdict(sid, trail.Verdict{Reward: ev.Reward, Details: ev.Details, At: time.Now()}); err != nil {
		v.c.log.Warn("record verdict", slog.String("env", env.ID), slog.String("state", sid), slog.Any("err", err))
	}
	return ev, nil
}

// Trajectory is the path from the root of a lineage to a state.
type Trajectory struct {
	// EnvID is the env asked for ("" for a state id); StateID the state
	// the path ends at (an env's head), Root the state its episode began
	// at (a reset's; else the lineage's first state).
	EnvID, StateID, Root string
	Turns                []TrajectoryTurn
	// Missing are states on the path whose turns are not recorded (made
	// before the server recorded trajectories, or shipped from another
	// node): the path skips what led to them.
	Missing []string
}

// TrajectoryTurn is one turn of a trajectory.
type TrajectoryTurn struct {
	trail.Turn
	// Verdict is the newest evaluation of the turn's state, if any.
	Verdict *trail.Verdict
	// Checkpoint is the timings of the checkpoint the turn's state was
	// taken with (the state's record: "total", "freeze", "snapshot",
	// "dump"...), for the turn that made the state.
	Checkpoint map[string]time.Duration
}

// Trajectory returns the path from the root to state stateID, or to the
// head of env envID (with its turns that took no checkpoint since its
// head state): every turn's action, observation, timings and the newest
// verdict on its state. The caller holds envID's ticket. A state id a
// step just returned may be named at once (its checkpoint is waited
// for, as for branch); a state the engine does not hold is
// state.ErrUnknownState.
func (c *Coordinator) Trajectory(ctx context.Context, envID, stateID string) (*Trajectory, error) {
	if (envID == "") == (stateID == "") {
		return nil, fmt.Errorf("%w: trajectory needs exactly one of env_id and state_id", state.ErrInvalidParams)
	}
	out := &Trajectory{EnvID: envID, StateID: stateID}
	var pending []trail.Turn
	if envID != "" {
		env, m, err := c.lookup(ctx, envID)
		if err != nil {
			return nil, err
		}
		// The head's record is in the engine once its checkpoint
		// committed; a failure stays for the next turn to report.
		if _, err := c.e.WaitCheckpoint(ctx, env); err != nil {
			return nil, err
		}
		c.observePending(m)
		out.StateID = env.Head()
		pending = c.pendingTrail(m, out.StateID)
	} else if err := c.settle(ctx, stateID); err != nil {
		return nil, err
	} else if c.foreignState(ctx, stateID) {
		return nil, fmt.Errorf("%w: no state %q", state.ErrUnknownState, stateID)
	}
	line, err := c.e.Lineage(out.StateID)
	if err != nil {
		if errors.Is(err, state.ErrUnknownState) {
			return nil, fmt.Errorf("%w: no state %q", state.ErrUnknownState, out.StateID)
		}
		return nil, err
	}
	if len(line) > 0 {
		out.Root = line[0].ID
	}
	timings := map[string]map[string]time.Duration{}
	for _, st := range line {
		timings[st.ID] = st.Timings
		seg, ok, err := c.trail.Segment(st.ID)
		if err != nil {
			return nil, err
		}
		if !ok {
			if st.Parent != "" {
				out.Missing = append(out.Missing, st.ID)
			}
			continue
		}
		if seg.Start {
			// The episode began here: what made the state (a task's
			// setup) is no turn of it.
			out.Root, out.Turns, out.Missing = st.ID, nil, nil
		}
		for _, t := range seg.Turns {
			out.Turns = append(out.Turns, TrajectoryTurn{Turn: t})
		}
	}
	for _, t := range pending {
		out.Turns = append(out.Turns, TrajectoryTurn{Turn: t})
	}
	verdicts := map[string]*trail.Verdict{}
	for i := range out.Turns {
		t := &out.Turns[i]
		v, seen := verdicts[t.State]
		if !seen {
			if got, ok, err := c.trail.Verdict(t.State); err != nil {
				return nil, err
			} else if ok {
				v = &got
			}
			verdicts[t.State] = v
		}
		t.Verdict = v
		if t.State != t.Parent {
			t.Checkpoint = timings[t.State]
		}
	}
	return out, nil
}
