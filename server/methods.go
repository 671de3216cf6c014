package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/shcmd"
	"github.com/arbor-env/arbor/server/protocol"
)

// request is one request being served.
type request struct {
	c      *conn
	msgid  uint32
	method string
	// serve serves the request with its decoded params; err, when set, is
	// why its params were refused (and serve is nil).
	serve         func(ctx context.Context) (any, error)
	err           error
	wait, release func()
	// batch holds the parsed items of a step_batch, each with its ticket.
	batch []batchItem
}

type batchItem struct {
	envID         string
	action        protocol.Action
	wait, release func()
}

// handler serves one method. parse runs on the read loop (decoding only,
// no blocking): it decodes and validates the params into r (r.serve or
// r.err) and names the envs whose tickets the request takes.
type handler struct {
	parse func(s *Server, r *request, params msgpack.RawMessage) []string
	// self: the handler orders itself (per-item tickets).
	self bool
}

// method is the handler of a method whose params are a P: envs (nil for
// none) names the envs whose tickets a request takes, fn serves it.
func method[P any, PP interface {
	*P
	protocol.Params
}](envs func(s *Server, r *request, p PP) ([]string, error), fn func(r *request, ctx context.Context, p PP) (any, error)) handler {
	return handler{parse: func(s *Server, r *request, params msgpack.RawMessage) []string {
		p := PP(new(P))
		if r.err = protocol.DecodeParams(params, p); r.err != nil {
			return nil
		}
		var ids []string
		if envs != nil {
			if ids, r.err = envs(s, r, p); r.err != nil {
				return nil
			}
		}
		r.serve = func(ctx context.Context) (any, error) { return fn(r, ctx, p) }
		return ids
	}}
}

func stepEnvs(_ *Server, _ *request, p *protocol.StepParams) ([]string, error) {
	return []string{p.EnvID}, nil
}

func envEnvs(_ *Server, _ *request, p *protocol.EnvParams) ([]string, error) {
	return []string{p.EnvID}, nil
}

func rollbackEnvs(_ *Server, _ *request, p *protocol.RollbackParams) ([]string, error) {
	return []string{p.EnvID}, nil
}

var handlers map[string]handler

func init() {
	batch := method(batchEnvs, (*request).stepBatch)
	batch.self = true
	handlers = map[string]handler{
		protocol.MethodHello:      method(nil, (*request).hello),
		protocol.MethodReset:      method(nil, (*request).reset),
		protocol.MethodStep:       method(stepEnvs, (*request).step),
		protocol.MethodBranch:     method(branchEnvs, (*request).branch),
		protocol.MethodCheckpoint: method(envEnvs, (*request).checkpoint),
		protocol.MethodRollback:   method(rollbackEnvs, (*request).rollback),
		protocol.MethodPromote:    method(promoteEnvs, (*request).promote),
		protocol.MethodDiscard:    method(envEnvs, (*request).discard),
		protocol.MethodEvaluate:   method(envEnvs, (*request).evaluate),
		protocol.MethodClose:      method(envEnvs, (*request).close),
		protocol.MethodEnvs:       method(nil, (*request).envs),
		protocol.MethodStates:     method(envEnvs, (*request).states),
		protocol.MethodStepBatch:  batch,
	}
}

func (r *request) server() *Server { return r.c.s }

func (r *request) hello(ctx context.Context, p *protocol.HelloParams) (any, error) {
	s := r.server()
	if tok := p.Token; !r.c.authed.Load() {
		if !s.authorized(tok) || tok == "" {
			return nil, protocol.Errorf(protocol.CodeUnauthorized, "wrong or missing token")
		}
		r.c.authed.Store(true)
	}
	kinds := []string{string(branch.None), string(branch.FS), string(branch.Proc), string(branch.Full)}
	return protocol.HelloResult{Version: protocol.Version, Server: "arbor " + s.o.Version, Capabilities: protocol.Capabilities{
		Methods: protocol.Methods, Tools: protocol.Tools, CheckpointKinds: kinds, Tasks: s.pool.TaskNames(),
		MaxFrameBytes: s.o.MaxFrameBytes, MaxInFlight: s.o.MaxInFlight, MaxEnvs: s.o.MaxEnvs, MaxBatch: s.o.MaxBatch,
	}}, nil
}

func (r *request) reset(ctx context.Context, p *protocol.ResetParams) (any, error) {
	s := r.server()
	req := ResetRequest{Image: p.Image, Task: p.Task}
	if p.Seed != nil {
		req.Seed = *p.Seed
	}
	if err := s.reserve(1); err != nil {
		return nil, err
	}
	defer s.unreserve(1)
	res, err := s.pool.Reset(ctx, req)
	if err != nil {
		return nil, err
	}
	env := res.Env
	task := res.Task
	if task.Image == "" {
		task.Image = env.Image
	}
	base := env.Turn()
	s.adopt(env, task, base, p.Seed)
	s.m.checkpoints.WithLabelValues(string(branch.Full)).Inc()
	info := protocol.Info{StateID: res.StateID, Turn: 0, Checkpoint: string(branch.Full), Task: task.Name, Image: task.Image, MaxTurns: task.MaxTurns}
	info.Seed = p.Seed
	s.log.Debug("reset", slog.String("env", env.ID), slog.String("task", task.Name), slog.String("image", task.Image))
	return protocol.ResetResult{EnvID: env.ID, Obs: protocol.Obs{Stdout: protocol.Text(res.Instruction), Instruction: res.Instruction}, Info: info}, nil
}

func (r *request) step(ctx context.Context, p *protocol.StepParams) (any, error) {
	return r.server().step(ctx, p.EnvID, p.Action)
}

// observePending reads the timing of the env's last background checkpoint
// (which the operation now running has waited for) into the metrics.
func (s *Server) observePending(m *envMeta) {
	if m.pending == "" {
		return
	}
	if st, err := s.e.State(m.pending); err == nil {
		if d, ok := st.Timings["total"]; ok {
			s.m.checkpoint.WithLabelValues("background").Observe(d.Seconds())
		}
	}
	m.pending = ""
}

// step runs one action; the caller holds the env's ticket.
func (s *Server) step(ctx context.Context, envID string, a protocol.Action) (*protocol.StepResult, error) {
	start := time.Now()
	env, m, err := s.lookup(envID)
	if err != nil {
		return nil, err
	}
	if a.Tool == protocol.ToolRollback {
		return s.stepRollback(ctx, env, m, a, start)
	}
	var cmd string
	timeout := m.task.CommandTimeout
	if timeout <= 0 {
		timeout = s.o.DefaultTimeout
	}
	switch a.Tool {
	case protocol.ToolBash:
		cmd = a.Cmd
		if a.TimeoutS > 0 {
			timeout = time.Duration(a.TimeoutS * float64(time.Second))
		}
	case protocol.ToolWriteFile:
		cmd = shcmd.WriteFile(a.Path, a.Content)
	case protocol.ToolReadFile:
		cmd = shcmd.ReadFile(a.Path)
	}
	timeout = min(timeout, s.o.MaxTimeout)
	res, err := s.e.Exec(ctx, env, cmd, sandbox.ExecOptions{Timeout: timeout, MaxOutput: a.MaxOutput})
	if err != nil {
		return nil, fmt.Errorf("step in env %s: %w", envID, revivedError(err, m))
	}
	s.observePending(m)
	info := protocol.Info{Tool: a.Tool, Task: m.task.Name, MaxTurns: m.task.MaxTurns,
		ShellRestarted: res.ShellRestarted, StdoutBytes: res.StdoutBytes, StderrBytes: res.StderrBytes, Recovered: m.takeRecovered()}
	for _, l := range res.Limits {
		info.Limits = append(info.Limits, l.String())
	}
	kind := s.o.Classifier.Classify(ctx, env, Turn{Tool: a.Tool, Cmd: cmd, Result: res})
	if ckErr := env.TakeCheckpointError(); ckErr != nil {
		// The previous turn's state never came to be: this one holds
		// changes no state has, whatever the classifier saw.
		info.CheckpointError = ckErr.Error()
		kind = branch.Full
	}
	sid, err := s.e.CheckpointAsync(env, kind)
	if err != nil {
		return nil, fmt.Errorf("queue checkpoint of env %s: %w", envID, err)
	}
	if kind != branch.None {
		m.pending = sid
	}
	s.m.checkpoints.WithLabelValues(string(kind)).Inc()
	info.StateID, info.Checkpoint = sid, string(kind)
	if s.o.VerifySkips && kind != branch.Full {
		v, err := s.e.Verify(ctx, env, sid)
		switch {
		case err != nil:
			info.VerifyMisses = []string{"verification failed: " + err.Error()}
			s.m.verified.WithLabelValues("miss").Inc()
		case len(v.Misses) > 0:
			info.VerifyMisses = v.Misses
			s.m.verified.WithLabelValues("miss").Inc()
		default:
			s.m.verified.WithLabelValues("ok").Inc()
		}
	}
	info.Turn = env.Turn() - m.base
	out := &protocol.StepResult{
		Obs: protocol.Obs{Stdout: protocol.Text(res.Stdout), Stderr: protocol.Text(res.Stderr), ExitCode: res.ExitCode,
			TimedOut: res.TimedOut, Truncated: res.Truncated, Cwd: res.Cwd, DurationS: res.Duration.Seconds()},
		Truncated: m.task.MaxTurns > 0 && info.Turn >= m.task.MaxTurns,
		Info:      info,
	}
	s.m.step.WithLabelValues(a.Tool).Observe(time.Since(start).Seconds())
	return out, nil
}

// settle waits until state sid is committed when it is the head of an
// open env whose background checkpoint still runs: a client may branch
// from or roll back to a state id the moment a step returned it. The wait
// raises the checkpoint's priority.
func (s *Server) settle(ctx context.Context, sid string) error {
	if _, err := s.e.State(sid); err == nil {
		return nil
	}
	for _, env := range s.e.Envs() {
		if env.Head() != sid {
			continue
		}
		if _, err := s.e.WaitCheckpoint(ctx, env); err != nil {
			return err
		}
		if ckErr := env.TakeCheckpointError(); ckErr != nil {
			// The env has changes no state holds: checkpoint them now, so
			// that its head is a real state again.
			if _, err := s.e.Checkpoint(ctx, env, branch.Full); err != nil {
				return err
			}
			return fmt.Errorf("state %s: %w", sid, ckErr)
		}
		return nil
	}
	return nil // unknown: the caller reports it
}

// seen reports whether sid is a state env may address: an ancestor of its
// head or any state it made (including ones a rollback left behind).
func (s *Server) seen(env *branch.Env, sid string) bool {
	if l, err := s.e.Lineage(env.Head()); err == nil {
		for _, st := range l {
			if st.ID == sid {
				return true
			}
		}
	}
	if sts, err := s.e.States(env.ID); err == nil {
		for _, st := range sts {
			if st.ID == sid {
				return true
			}
		}
	}
	return false
}

// restore rolls env back to sid and reports the turn it is at.
func (s *Server) restore(ctx context.Context, env *branch.Env, m *envMeta, sid string) (protocol.Info, error) {
	t := time.Now()
	if err := s.e.Rollback(ctx, env, sid); err != nil {
		return protocol.Info{}, err
	}
	s.m.restore.Observe(time.Since(t).Seconds())
	s.observePending(m)
	env.TakeCheckpointError() // that state is gone with the sandbox that made it
	return protocol.Info{StateID: sid, Turn: env.Turn() - m.base, Checkpoint: string(branch.None), Restored: sid,
		Task: m.task.Name, MaxTurns: m.task.MaxTurns, Recovered: m.takeRecovered()}, nil
}

// stepRollback is the rollback tool: the agent's own rollback. A state
// the agent has not seen is its mistake, reported in the observation; a
// restore that fails is an infrastructure error.
func (s *Server) stepRollback(ctx context.Context, env *branch.Env, m *envMeta, a protocol.Action, start time.Time) (*protocol.StepResult, error) {
	fail := func(msg string) *protocol.StepResult {
		return &protocol.StepResult{Obs: protocol.Obs{Stderr: protocol.Text(msg + "\n"), ExitCode: 2},
			Info: protocol.Info{Tool: a.Tool, StateID: env.Head(), Turn: env.Turn() - m.base, Checkpoint: string(branch.None),
				Task: m.task.Name, MaxTurns: m.task.MaxTurns}}
	}
	if err := s.settle(ctx, a.StateID); err != nil {
		return nil, err
	}
	// The env's own head has no lineage in the manifest until its
	// background checkpoint commits: wait for it (the gate the rollback
	// takes anyway) before asking which states the env may address.
	if _, err := s.e.WaitCheckpoint(ctx, env); err != nil {
		return nil, err
	}
	if _, err := s.e.State(a.StateID); err != nil || !s.seen(env, a.StateID) {
		return fail(fmt.Sprintf("rollback: %s is not a state of this environment's history", a.StateID)), nil
	}
	info, err := s.restore(ctx, env, m, a.StateID)
	if err != nil {
		return nil, err
	}
	info.Tool = a.Tool
	obs := protocol.Obs{Stdout: protocol.Text(fmt.Sprintf("rolled back to state %s (turn %d): files, processes and shell state are as they were then\n", a.StateID, info.Turn))}
	// The shell's working directory, read without counting a turn.
	if r, err := env.Sandbox().Exec(ctx, "pwd", sandbox.ExecOptions{Timeout: 5 * time.Second}); err == nil {
		obs.Cwd = r.Cwd
	}
	obs.DurationS = time.Since(start).Seconds()
	s.m.step.WithLabelValues(a.Tool).Observe(obs.DurationS)
	return &protocol.StepResult{Obs: obs, Truncated: m.task.MaxTurns > 0 && info.Turn >= m.task.MaxTurns, Info: info}, nil
}

func branchEnvs(_ *Server, _ *request, p *protocol.BranchParams) ([]string, error) {
	if p.EnvID != "" {
		return []string{p.EnvID}, nil
	}
	return nil, nil
}

func (r *request) branch(ctx context.Context, p *protocol.BranchParams) (any, error) {
	s := r.server()
	envID, sid, n := p.EnvID, p.StateID, p.N
	if n > s.o.MaxEnvs {
		return nil, protocol.Errorf(protocol.CodeTooManyEnvs, "n=%d is over the server's limit of %d envs", n, s.o.MaxEnvs)
	}
	src := branch.Source{State: sid}
	var meta *envMeta
	if envID != "" {
		env, m, err := s.lookup(envID)
		if err != nil {
			return nil, err
		}
		s.observePending(m)
		src, meta = branch.Source{Env: env}, m
	} else {
		if err := s.settle(ctx, sid); err != nil {
			return nil, err
		}
		st, err := s.e.State(sid)
		if err != nil {
			return nil, err
		}
		// Children of a state inherit the task of the env that made it,
		// while the server still knows it.
		s.mu.Lock()
		meta = s.envs[st.Env]
		s.mu.Unlock()
	}
	if err := s.reserve(n); err != nil {
		return nil, err
	}
	defer s.unreserve(n)
	res, err := s.pool.Branch(ctx, src, n)
	if err != nil {
		return nil, err
	}
	s.m.branch.Observe(res.Took.Seconds())
	out := protocol.BranchResult{EnvIDs: make([]string, n), StateID: res.State, TookS: res.Took.Seconds()}
	var task TaskInfo
	base := 0
	if meta != nil {
		task, base = meta.task, meta.base
	}
	failed := 0
	for i, c := range res.Children {
		if err := res.Errors[i]; err != nil || c == nil {
			if err == nil {
				err = errors.New("no env")
			}
			if out.Errors == nil {
				out.Errors = make([]*protocol.Error, n)
			}
			out.Errors[i] = protoError(err)
			failed++
			continue
		}
		out.EnvIDs[i] = c.ID
		t := task
		if pt, ok := s.pool.TaskOf(c.ID); ok {
			t = pt
		}
		s.adopt(c, t, base, nil)
	}
	if failed == n {
		return nil, res.Errors[0]
	}
	return out, nil
}

func (r *request) checkpoint(ctx context.Context, p *protocol.EnvParams) (any, error) {
	s := r.server()
	env, m, err := s.lookup(p.EnvID)
	if err != nil {
		return nil, err
	}
	s.observePending(m)
	t := time.Now()
	sid, err := s.e.Checkpoint(ctx, env, branch.Full)
	if err != nil {
		return nil, err
	}
	s.m.checkpoint.WithLabelValues("forced").Observe(time.Since(t).Seconds())
	s.m.checkpoints.WithLabelValues(string(branch.Full)).Inc()
	return protocol.CheckpointResult{StateID: sid}, nil
}

func (r *request) rollback(ctx context.Context, p *protocol.RollbackParams) (any, error) {
	s := r.server()
	env, m, err := s.lookup(p.EnvID)
	sid := p.StateID
	if err != nil {
		return nil, err
	}
	if err := s.settle(ctx, sid); err != nil {
		return nil, err
	}
	info, err := s.restore(ctx, env, m, sid)
	if err != nil {
		return nil, err
	}
	return protocol.RollbackResult{Info: info}, nil
}

func promoteEnvs(s *Server, _ *request, p *protocol.PromoteParams) ([]string, error) {
	ids := []string{p.EnvID}
	if env, err := s.e.Env(p.EnvID); err == nil && env.Origin != "" {
		ids = append(ids, env.Origin)
	}
	return ids, nil
}

func (r *request) promote(ctx context.Context, p *protocol.PromoteParams) (any, error) {
	s := r.server()
	child, m, err := s.lookup(p.EnvID)
	if err != nil {
		return nil, err
	}
	s.observePending(m)
	origin := child.Origin
	if origin == "" {
		return nil, protocol.Errorf(protocol.CodeBadRequest, "env %s was not branched from an env: nothing to promote it into", child.ID)
	}
	if _, _, err := s.lookup(origin); err != nil {
		return nil, protocol.Errorf(protocol.CodeBadRequest, "origin env %s of %s is not open", origin, child.ID)
	}
	sid, err := s.pool.Promote(ctx, child)
	if err != nil {
		return nil, err
	}
	s.forget(child.ID)
	return protocol.PromoteResult{EnvID: origin, StateID: sid}, nil
}

func (r *request) discard(ctx context.Context, p *protocol.EnvParams) (any, error) {
	s := r.server()
	if s.isLost(p.EnvID) {
		return s.dropLost(ctx, p.EnvID)
	}
	env, _, err := s.lookup(p.EnvID)
	if err != nil {
		return nil, err
	}
	if err := s.pool.Discard(ctx, env); err != nil {
		return nil, err
	}
	s.forget(env.ID)
	return protocol.Empty{}, nil
}

func (r *request) evaluate(ctx context.Context, p *protocol.EnvParams) (any, error) {
	s := r.server()
	env, m, err := s.lookup(p.EnvID)
	if err != nil {
		return nil, err
	}
	s.observePending(m)
	ev, err := s.pool.Evaluate(ctx, env)
	if err != nil {
		return nil, err
	}
	if ev.Details == nil {
		ev.Details = map[string]any{}
	}
	return protocol.Evaluation{Reward: ev.Reward, Details: ev.Details}, nil
}

func (r *request) close(ctx context.Context, p *protocol.EnvParams) (any, error) {
	s := r.server()
	if s.isLost(p.EnvID) {
		return s.dropLost(ctx, p.EnvID)
	}
	env, _, err := s.lookup(p.EnvID)
	if err != nil {
		return nil, err
	}
	s.forget(env.ID)
	if err := s.e.CloseEnv(ctx, env); err != nil {
		return nil, err
	}
	return protocol.Empty{}, nil
}

func (r *request) envs(ctx context.Context, _ *protocol.EnvsParams) (any, error) {
	s := r.server()
	s.mu.Lock()
	metas := make(map[string]*envMeta, len(s.envs))
	for id, m := range s.envs {
		metas[id] = m
	}
	s.mu.Unlock()
	out := protocol.EnvsResult{Envs: []protocol.EnvInfo{}}
	now := time.Now()
	for _, env := range s.e.Envs() {
		m, ok := metas[env.ID]
		if !ok {
			continue // the pool's reserve, verifier forks
		}
		info := protocol.EnvInfo{EnvID: env.ID, Image: env.Image, Task: m.task.Name, Origin: env.Origin,
			Head: env.Head(), Turn: env.Turn() - m.base, IdleS: now.Sub(time.Unix(0, m.used.Load())).Seconds()}
		if rec := env.Recovered(); rec != nil {
			info.Recovered = &protocol.Recovered{StateID: rec.State, Turn: rec.Turn - m.base}
		}
		out.Envs = append(out.Envs, info)
	}
	s.mu.Lock()
	for _, l := range s.lost {
		task, _ := taskFromLabels(l.Labels)
		out.Envs = append(out.Envs, protocol.EnvInfo{EnvID: l.ID, Image: l.Image, Task: task.Name, Head: l.Head, Lost: lostError(l).Message})
	}
	s.mu.Unlock()
	sort.Slice(out.Envs, func(i, j int) bool { return out.Envs[i].EnvID < out.Envs[j].EnvID })
	return out, nil
}

func (r *request) states(ctx context.Context, p *protocol.EnvParams) (any, error) {
	s := r.server()
	env, m, err := s.lookup(p.EnvID)
	if err != nil {
		return nil, err
	}
	head := env.Head()
	l, err := s.e.Lineage(head)
	if errors.Is(err, branch.ErrUnknownState) {
		// The head's checkpoint is still running: wait for it (at high
		// priority) by asking for a checkpoint of kind none.
		if head, err = s.e.Checkpoint(ctx, env, branch.None); err != nil {
			return nil, err
		}
		if ckErr := env.TakeCheckpointError(); ckErr != nil {
			// It failed; the env has changes no state holds.
			if head, err = s.e.Checkpoint(ctx, env, branch.Full); err != nil {
				return nil, err
			}
		}
		l, err = s.e.Lineage(head)
	}
	if err != nil {
		return nil, err
	}
	s.observePending(m)
	out := protocol.StatesResult{EnvID: env.ID, Head: head, States: make([]protocol.StateInfo, 0, len(l))}
	for _, st := range l {
		out.States = append(out.States, protocol.StateInfo{StateID: st.ID, Parent: st.Parent, EnvID: st.Env,
			Turn: st.Turn - m.base, Kind: string(st.Kind), Created: st.Created.Format(time.RFC3339Nano)})
	}
	return out, nil
}

// batchEnvs checks the size of a step_batch and takes each item's ticket,
// in item order.
func batchEnvs(s *Server, r *request, p *protocol.StepBatchParams) ([]string, error) {
	if len(p.Items) > s.o.MaxBatch {
		return nil, protocol.Errorf(protocol.CodeInvalidParams, "items: %d items, the limit is %d", len(p.Items), s.o.MaxBatch)
	}
	r.batch = make([]batchItem, len(p.Items))
	for i, it := range p.Items {
		r.batch[i] = batchItem{envID: it.EnvID, action: it.Action}
		r.batch[i].wait, r.batch[i].release = s.ticket(it.EnvID)
	}
	return nil, nil
}

func (r *request) stepBatch(ctx context.Context, _ *protocol.StepBatchParams) (any, error) {
	s := r.server()
	out := protocol.StepBatchResult{Results: make([]protocol.BatchItemResult, len(r.batch))}
	var wg sync.WaitGroup
	for i, it := range r.batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it.wait()
			res, err := s.step(ctx, it.envID, it.action)
			it.release()
			br := protocol.BatchItemResult{MsgID: r.msgid, Index: i, EnvID: it.envID, Result: res}
			if err != nil {
				br.Error, br.Result = protoError(err), nil
			}
			out.Results[i] = br
			r.c.notify(protocol.NotifyStepBatch, br)
		}()
	}
	wg.Wait()
	for i := range out.Results {
		out.Results[i].MsgID = 0
	}
	return out, nil
}
