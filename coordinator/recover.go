package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/state"
)

// The labels the coordinator keeps on every env it hands out
// (Engine.SetLabels), so that a coordinator restarted after a crash can
// adopt the env again with its task, seed and episode turn
// (docs/engine.md, "Crash safety").
const (
	labelServed   = "arbor.server" // "1": handed out by the coordinator
	labelTask     = "arbor.task"
	labelImage    = "arbor.image"
	labelMaxTurns = "arbor.max_turns"
	labelTimeout  = "arbor.command_timeout"
	labelBase     = "arbor.base"
	labelSeed     = "arbor.seed"
)

// labels are what adoptRecovered needs to adopt an env again.
func labels(task TaskInfo, base int, seed int64, tenant string) map[string]string {
	l := map[string]string{labelServed: "1", labelTask: task.Name, labelImage: task.Image,
		labelMaxTurns: strconv.Itoa(task.MaxTurns), labelBase: strconv.Itoa(base), labelTenant: tenant}
	if task.CommandTimeout > 0 {
		l[labelTimeout] = task.CommandTimeout.String()
	}
	if seed != 0 {
		l[labelSeed] = strconv.FormatInt(seed, 10)
	}
	return l
}

// fromLabels reads back what labels wrote.
func fromLabels(l map[string]string) (task TaskInfo, base int, seed int64) {
	task = TaskInfo{Name: l[labelTask], Image: l[labelImage]}
	task.MaxTurns, _ = strconv.Atoi(l[labelMaxTurns])
	task.CommandTimeout, _ = time.ParseDuration(l[labelTimeout])
	base, _ = strconv.Atoi(l[labelBase])
	seed, _ = strconv.ParseInt(l[labelSeed], 10, 64)
	return task, base, seed
}

// Recovered is the state a restarted server restored an env at (its last
// committed state) and that state's turn in the episode.
type Recovered struct {
	StateID string
	Turn    int
}

// adoptRecovered takes back the envs the engine restored after a crash:
// those the coordinator had handed out are registered again with their
// task, seed and base turn from their labels, and their first operation
// reports it (TurnResult.Recovered, Restored.Recovered); the others (a
// task pool's reserve of the earlier run) have no owner any more and are
// closed, as are ephemeral ones (an MCP session's), which were never
// labelled. Handed-out envs the engine could not restore are kept as lost:
// operations on them answer env_lost, and Lost lists them; lost envs
// nobody was handed are forgotten (their states released).
func (c *Coordinator) adoptRecovered(ctx context.Context) {
	adopted := map[string]*branch.Env{}
	for _, env := range c.e.Envs() {
		rec := env.Recovered()
		if rec == nil {
			continue
		}
		l := env.Labels()
		if l[labelServed] != "1" {
			if err := c.e.CloseEnv(ctx, env); err != nil {
				c.log.Warn("close recovered env nobody owns", slog.String("env", env.ID), slog.Any("err", err))
			}
			continue
		}
		task, base, seed := fromLabels(l)
		m := c.register(env, task, seed, base, false, l[labelTenant])
		m.recovered = &Recovered{StateID: rec.State, Turn: rec.Turn - base}
		// The lineage it was restored at is this engine's again (a
		// cluster node publishes where states live).
		if line, err := c.e.Lineage(rec.State); err == nil {
			for _, st := range line {
				c.o.Hooks.StateMade(st.Env, st.ID)
			}
		}
		adopted[env.ID] = env
	}
	for _, env := range adopted {
		if _, ok := adopted[env.Origin]; !ok {
			env.Origin = "" // nothing to promote into any more
		}
	}
	var orphans []string
	lostEnvs := c.e.Lost()
	c.mu.Lock()
	for _, l := range lostEnvs {
		if l.Labels[labelServed] == "1" {
			c.lost[l.ID] = l
		} else {
			orphans = append(orphans, l.ID)
		}
	}
	lost := len(c.lost)
	c.mu.Unlock()
	// Lost envs nobody was handed (a task pool's reserve, an MCP
	// session's): nobody can close them, so they are forgotten now and
	// their states released, not kept across every later restart.
	for _, id := range orphans {
		if err := c.e.ForgetLost(ctx, id); err != nil {
			c.log.Warn("forget lost env nobody owns", slog.String("env", id), slog.Any("err", err))
		}
	}
	if len(adopted)+lost > 0 {
		c.log.Info("adopted the envs of the previous run", slog.Int("recovered", len(adopted)), slog.Int("lost", lost))
	}
}

// takeRecovered returns (once) the state the env was recovered at; the
// caller holds the env's ticket.
func (m *entry) takeRecovered() *Recovered {
	r := m.recovered
	m.recovered = nil
	return r
}

// LostEnv is an env handed out before a crash that could not be
// restored.
type LostEnv struct {
	ID, Image, Head string
	Task            TaskInfo
	// Err is what operations on it answer (env_lost).
	Err error
}

// Lost lists the envs handed out before a crash that could not be
// restored.
func (c *Coordinator) Lost(ctx context.Context) []LostEnv {
	t := tenant.From(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]LostEnv, 0, len(c.lost))
	for _, l := range c.lost {
		if !t.Sees(l.Labels[labelTenant]) {
			continue
		}
		task, _, _ := fromLabels(l.Labels)
		out = append(out, LostEnv{ID: l.ID, Image: l.Image, Head: l.Head, Task: task, Err: lostError(l)})
	}
	return out
}

// dropLost removes id from the lost envs, reporting whether it was one.
func (c *Coordinator) dropLost(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.lost[id]
	delete(c.lost, id)
	return ok
}

// lostError is the answer to an operation on a lost env.
func lostError(l branch.LostEnv) error {
	return fmt.Errorf("%w: env %s was open when the server stopped and could not be restored: %v", state.ErrLost, l.ID, l.Err)
}

// revivedError reports a turn whose env's sandbox died and was restored,
// with the episode's turn.
func revivedError(err error, m *entry) error {
	var rv *branch.RevivedError
	if !errors.As(err, &rv) {
		return err
	}
	return state.Errorf(state.ErrInfra, "the sandbox of env %s died (%v); the env was restored to state %s (turn %d): the step did not run",
		rv.Env, rv.Cause, rv.State, rv.Turn-m.base)
}
