package server

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/server/protocol"
)

// The labels the server keeps on every env it hands out (Engine.SetLabels),
// so that a server restarted after a crash can adopt the env again with
// its task and episode turn (docs/engine.md, "Crash safety").
const (
	labelServed   = "arbor.server" // "1": handed out by the server
	labelTask     = "arbor.task"
	labelImage    = "arbor.image"
	labelMaxTurns = "arbor.max_turns"
	labelTimeout  = "arbor.command_timeout"
	labelBase     = "arbor.base"
	labelSeed     = "arbor.seed"
)

// labels are what adoptRecovered needs to adopt an env again.
func labels(task TaskInfo, base int, seed *int64) map[string]string {
	l := map[string]string{labelServed: "1", labelTask: task.Name, labelImage: task.Image,
		labelMaxTurns: strconv.Itoa(task.MaxTurns), labelBase: strconv.Itoa(base)}
	if task.CommandTimeout > 0 {
		l[labelTimeout] = task.CommandTimeout.String()
	}
	if seed != nil {
		l[labelSeed] = strconv.FormatInt(*seed, 10)
	}
	return l
}

// taskFromLabels reads back what labels wrote.
func taskFromLabels(l map[string]string) (TaskInfo, int) {
	t := TaskInfo{Name: l[labelTask], Image: l[labelImage]}
	t.MaxTurns, _ = strconv.Atoi(l[labelMaxTurns])
	t.CommandTimeout, _ = time.ParseDuration(l[labelTimeout])
	base, _ := strconv.Atoi(l[labelBase])
	return t, base
}

// adoptRecovered takes back the envs the engine restored after a crash:
// those the server had handed out are adopted with their task and base
// turn from their labels, and their first operation reports
// info.recovered; the others (the pool's reserve and MCP sessions of the
// earlier run) have no owner any more and are closed. Handed-out envs
// the engine could not restore are kept as lost: operations on them
// answer env_lost, and envs lists them.
func (s *Server) adoptRecovered(ctx context.Context) {
	adopted := map[string]*branch.Env{}
	for _, env := range s.e.Envs() {
		rec := env.Recovered()
		if rec == nil {
			continue
		}
		l := env.Labels()
		if l[labelServed] != "1" {
			if err := s.e.CloseEnv(ctx, env); err != nil {
				s.log.Warn("close recovered env nobody owns", slog.String("env", env.ID), slog.Any("err", err))
			}
			continue
		}
		task, base := taskFromLabels(l)
		m := s.adopt(env, task, base, nil)
		m.recovered = &protocol.Recovered{StateID: rec.State, Turn: rec.Turn - base}
		s.pool.Touch(env.ID) // the idle TTL applies again
		adopted[env.ID] = env
	}
	for _, env := range adopted {
		if _, ok := adopted[env.Origin]; !ok {
			env.Origin = "" // nothing to promote into any more
		}
	}
	s.mu.Lock()
	for _, l := range s.e.Lost() {
		if l.Labels[labelServed] == "1" {
			s.lost[l.ID] = l
		}
	}
	s.mu.Unlock()
	if len(adopted)+len(s.lost) > 0 {
		s.log.Info("adopted the envs of the previous run", slog.Int("recovered", len(adopted)), slog.Int("lost", len(s.lost)))
	}
}

// takeRecovered returns (once) the state the env was recovered at; the
// caller holds the env's ticket.
func (m *envMeta) takeRecovered() *protocol.Recovered {
	r := m.recovered
	m.recovered = nil
	return r
}

// dropLost answers close or discard of a lost env: the engine forgets it
// and releases its states.
func (s *Server) dropLost(ctx context.Context, id string) (any, error) {
	s.mu.Lock()
	delete(s.lost, id)
	s.mu.Unlock()
	if err := s.e.ForgetLost(ctx, id); err != nil {
		return nil, err
	}
	return protocol.Empty{}, nil
}

func (s *Server) isLost(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.lost[id]
	return ok
}

// lostError is the answer to an operation on a lost env.
func lostError(l branch.LostEnv) *protocol.Error {
	return protocol.Errorf(protocol.CodeEnvLost, "env %s was open when the server stopped and could not be restored: %v", l.ID, l.Err)
}

// revivedError reports a step whose env's sandbox died and was restored,
// with the episode's turn.
func revivedError(err error, m *envMeta) error {
	var rv *branch.RevivedError
	if !errors.As(err, &rv) {
		return err
	}
	return protocol.Errorf(protocol.CodeSandboxFailed, "the sandbox of env %s died (%v); the env was restored to state %s (turn %d): the step did not run",
		rv.Env, rv.Cause, rv.State, rv.Turn-m.base)
}
