package server

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/panics"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
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
	// cost is the most its answer can take (answerBudget), reserved what
	// run reserved of it.
	cost, reserved int64
	// batch holds the parsed items of a step_batch, each with its ticket.
	batch []batchItem
}

type batchItem struct {
	envID, key    string
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
		r.cost = answerCost(p)
		return ids
	}}
}

func stepEnvs(_ *Server, _ *request, p *protocol.StepParams) ([]string, error) {
	return []string{p.EnvID}, nil
}

func envEnvs(_ *Server, _ *request, p *protocol.EnvParams) ([]string, error) {
	return []string{p.EnvID}, nil
}

func evaluateEnvs(_ *Server, _ *request, p *protocol.EvaluateParams) ([]string, error) {
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
		protocol.MethodEvaluate:   method(evaluateEnvs, (*request).evaluate),
		protocol.MethodClose:      method(envEnvs, (*request).close),
		protocol.MethodEnvs:       method(nil, (*request).envs),
		protocol.MethodStates:     method(envEnvs, (*request).states),
		protocol.MethodStepBatch:  batch,
		protocol.MethodRelease:    method(nil, (*request).releaseStates),
		protocol.MethodPin:        method(nil, (*request).pinStates),
		protocol.MethodUnpin:      method(nil, (*request).unpinStates),
		protocol.MethodMigrate:    method(nil, (*request).migrate),
		protocol.MethodPrepare:    method(nil, (*request).prepare),
		protocol.MethodTrajectory: method(trajectoryEnvs, (*request).trajectory),
		protocol.MethodTasks:      method(nil, (*request).tasks),
	}
}

func (r *request) server() *Server { return r.c.s }

func (r *request) hello(ctx context.Context, p *protocol.HelloParams) (any, error) {
	s := r.server()
	if tok := p.Token; !r.c.authed.Load() {
		t, ok := s.authenticate(tok)
		if !ok || tok == "" {
			return nil, state.Errorf(protocol.ErrUnauthorized, "wrong or missing token")
		}
		r.c.who.Store(&who{t: t, token: tok})
		r.c.authed.Store(true)
	}
	kinds := []string{string(state.None), string(state.FS), string(state.Proc), string(state.Full)}
	var envs protocol.Capabilities
	if s.c != nil {
		envs = protocol.Capabilities{Tasks: s.c.TaskNames(), MaxEnvs: s.c.MaxEnvs(), EnvIdleTTLS: s.c.IdleTTL().Seconds()}
	} else {
		envs = s.o.Forwarder.Capabilities()
	}
	return protocol.HelloResult{Version: protocol.Version, Server: "arbor " + s.o.Version, Capabilities: protocol.Capabilities{
		Methods: protocol.Methods, Tools: protocol.Tools, CheckpointKinds: kinds, Tasks: envs.Tasks,
		MaxFrameBytes: s.o.MaxFrameBytes, MaxInFlight: s.o.MaxInFlight, MaxEnvs: envs.MaxEnvs, MaxBatch: s.o.MaxBatch,
		EnvIdleTTLS: envs.EnvIdleTTLS, MaxUnreadBytes: s.o.MaxUnreadBytes, StepKeys: true,
	}}, nil
}

func (r *request) reset(ctx context.Context, p *protocol.ResetParams) (any, error) {
	return r.server().reset(ctx, p, false)
}

// reset starts an episode; ephemeral: its env ends with what asked for
// it (an OpenEnv connection) and is not adopted again after a crash.
func (s *Server) reset(ctx context.Context, p *protocol.ResetParams, ephemeral bool) (*protocol.ResetResult, error) {
	req := coordinator.ResetRequest{Image: p.Image, Task: p.Task, Dataset: p.Dataset, Index: p.Index, Ephemeral: ephemeral}
	if p.Seed != nil {
		req.Seed = *p.Seed
	}
	if n, ok := p.MaxTurns(); ok {
		req.MaxTurns = &n
	}
	res, err := s.c.Reset(ctx, req)
	if err != nil {
		return nil, err
	}
	info := protocol.Info{StateID: res.StateID, Turn: 0, Checkpoint: string(state.Full), Task: res.Task.Name, Image: res.Task.Image,
		MaxTurns: res.Task.MaxTurns, Seed: p.Seed}
	return &protocol.ResetResult{EnvID: res.Env.ID, Obs: protocol.Obs{Stdout: protocol.Text(res.Instruction), Instruction: res.Instruction}, Info: info}, nil
}

func (r *request) tasks(_ context.Context, p *protocol.TasksParams) (any, error) {
	page, err := r.server().c.Tasks(p.Dataset, p.Cursor, p.Limit)
	if err != nil {
		return nil, err
	}
	out := &protocol.TasksResult{Tasks: []protocol.TaskSummary{}, NextCursor: page.Next}
	for _, t := range page.Tasks {
		out.Tasks = append(out.Tasks, protocol.TaskSummary{Name: t.Name, Image: t.Image, Difficulty: t.Difficulty, Tags: t.Tags,
			MaxTurns: t.MaxTurns, Error: t.Error})
	}
	for _, d := range page.Datasets {
		out.Datasets = append(out.Datasets, protocol.DatasetSummary{Name: d.Name, Instances: d.Instances})
	}
	return out, nil
}

func (r *request) step(ctx context.Context, p *protocol.StepParams) (any, error) {
	return r.server().step(ctx, p.EnvID, p.Action, p.Key)
}

// step runs one action as a turn of the coordinator; the caller holds the
// env's ticket. A step with a key that env already ran answers the
// recorded result; a keyed step that succeeds is recorded.
func (s *Server) step(ctx context.Context, envID string, a protocol.Action, key string) (*protocol.StepResult, error) {
	if key == "" {
		return s.turn(ctx, envID, a)
	}
	if err := s.c.OwnEnv(ctx, envID); err != nil {
		return nil, err // another tenant's keys are not this one's to replay
	}
	if res, err := s.keys.lookup(envID, key, a); res != nil || err != nil {
		return res, err
	}
	res, err := s.turn(ctx, envID, a)
	if err == nil {
		s.keys.record(envID, key, a, res)
	}
	return res, err
}

func (s *Server) turn(ctx context.Context, envID string, a protocol.Action) (*protocol.StepResult, error) {
	// timeout_s bounds every tool that runs a command, the file tools too:
	// a read_file of a FIFO waits for a writer that may never come.
	ca := coordinator.Action{Tool: a.Tool, Cmd: a.Cmd, Path: a.Path, Content: a.Content, StateID: a.StateID, MaxOutput: a.MaxOutput,
		Timeout: time.Duration(a.TimeoutS * float64(time.Second))}
	t, err := s.c.Turn(ctx, envID, ca)
	if err != nil {
		return nil, err
	}
	res := t.Result
	info := protocol.Info{Tool: a.Tool, StateID: t.StateID, Turn: t.Turn, Checkpoint: string(t.Kind), Task: t.Task.Name, MaxTurns: t.Task.MaxTurns,
		Restored: t.Restored, VerifyMisses: t.VerifyMisses, Recovered: recovered(t.Recovered)}
	if a.Tool != state.ToolRollback {
		info.ShellRestarted, info.StdoutBytes, info.StderrBytes = res.ShellRestarted, res.StdoutBytes, res.StderrBytes
	}
	for _, l := range res.Limits {
		info.Limits = append(info.Limits, l.String())
	}
	if t.CheckpointError != nil {
		info.CheckpointError = t.CheckpointError.Error()
	}
	return &protocol.StepResult{
		Obs: protocol.Obs{Stdout: protocol.Text(res.Stdout), Stderr: protocol.Text(res.Stderr), ExitCode: res.ExitCode,
			TimedOut: res.TimedOut, Truncated: res.Truncated, Cwd: res.Cwd, DurationS: res.Duration.Seconds()},
		Truncated: t.Truncated,
		Info:      info,
	}, nil
}

func branchEnvs(_ *Server, _ *request, p *protocol.BranchParams) ([]string, error) {
	if p.EnvID != "" {
		return []string{p.EnvID}, nil
	}
	return nil, nil
}

func (r *request) branch(ctx context.Context, p *protocol.BranchParams) (any, error) {
	return r.server().branch(ctx, p)
}

// branch makes p.N children of an env or a state; the caller holds the
// env's ticket.
func (s *Server) branch(ctx context.Context, p *protocol.BranchParams) (*protocol.BranchResult, error) {
	res, err := s.c.Branch(ctx, coordinator.BranchRequest{EnvID: p.EnvID, StateID: p.StateID, N: p.N})
	if err != nil {
		return nil, err
	}
	out := protocol.BranchResult{EnvIDs: make([]string, p.N), StateID: res.State, TookS: res.Took.Seconds(), Task: res.Task.Name, Turn: res.Turn}
	for i, c := range res.Children {
		if c == nil {
			if out.Errors == nil {
				out.Errors = make([]*protocol.Error, p.N)
			}
			out.Errors[i] = protocol.ErrorOf(res.Errors[i])
			continue
		}
		out.EnvIDs[i] = c.ID
	}
	return &out, nil
}

func (r *request) checkpoint(ctx context.Context, p *protocol.EnvParams) (any, error) {
	sid, err := r.server().c.Checkpoint(ctx, p.EnvID)
	if err != nil {
		return nil, err
	}
	return protocol.CheckpointResult{StateID: sid}, nil
}

func (r *request) rollback(ctx context.Context, p *protocol.RollbackParams) (any, error) {
	return r.server().rollback(ctx, p.EnvID, p.StateID)
}

// rollback restores an env at a state; the caller holds the env's ticket.
func (s *Server) rollback(ctx context.Context, envID, stateID string) (*protocol.RollbackResult, error) {
	res, err := s.c.Rollback(ctx, envID, stateID)
	if err != nil {
		return nil, err
	}
	return &protocol.RollbackResult{Info: protocol.Info{StateID: res.StateID, Turn: res.Turn, Checkpoint: string(state.None), Restored: res.StateID,
		Task: res.Task.Name, MaxTurns: res.Task.MaxTurns, Recovered: recovered(res.Recovered)}}, nil
}

func promoteEnvs(s *Server, _ *request, p *protocol.PromoteParams) ([]string, error) {
	ids := []string{p.EnvID}
	if origin := s.c.Origin(p.EnvID); origin != "" {
		ids = append(ids, origin)
	}
	return ids, nil
}

func (r *request) promote(ctx context.Context, p *protocol.PromoteParams) (any, error) {
	origin, sid, err := r.server().c.Promote(ctx, p.EnvID)
	if err != nil {
		return nil, err
	}
	r.server().keys.forget(p.EnvID)
	return protocol.PromoteResult{EnvID: origin, StateID: sid}, nil
}

// migrate is a cluster router's (docs/cluster.md, "Live migration"): a
// single server has no other node to move an env to.
func (r *request) migrate(ctx context.Context, p *protocol.MigrateParams) (any, error) {
	return nil, state.Errorf(state.ErrInvalid, "migrate moves an env between the nodes of a cluster: send it to an arbor router (docs/cluster.md)")
}

func (r *request) discard(ctx context.Context, p *protocol.EnvParams) (any, error) {
	if err := r.server().c.Discard(ctx, p.EnvID); err != nil {
		return nil, err
	}
	r.server().keys.forget(p.EnvID)
	return protocol.Empty{}, nil
}

func (r *request) evaluate(ctx context.Context, p *protocol.EvaluateParams) (any, error) {
	s := r.server()
	ev, err := s.evaluate(ctx, p.EnvID, p.Finish())
	if p.Finish() {
		if _, gone := s.c.Env(p.EnvID); gone != nil {
			s.keys.forget(p.EnvID)
		}
	}
	return ev, err
}

// evaluate runs the verifier of an env's task, and closes the env after
// when finish; the caller holds the env's ticket.
func (s *Server) evaluate(ctx context.Context, envID string, finish bool) (*protocol.Evaluation, error) {
	ev, err := s.c.Evaluate(ctx, envID, finish)
	if err != nil {
		return nil, err
	}
	return &protocol.Evaluation{Reward: ev.Reward, Details: ev.Details}, nil
}

func (r *request) close(ctx context.Context, p *protocol.EnvParams) (any, error) {
	return protocol.Empty{}, r.server().closeEnv(ctx, p.EnvID)
}

// closeEnv ends an env and forgets its step keys; the caller holds the
// env's ticket.
func (s *Server) closeEnv(ctx context.Context, envID string) error {
	if err := s.c.CloseEnv(ctx, envID); err != nil {
		return err
	}
	s.keys.forget(envID)
	return nil
}

func (r *request) envs(ctx context.Context, _ *protocol.EnvsParams) (any, error) {
	out := protocol.EnvsResult{Envs: []protocol.EnvInfo{}}
	c := r.server().c
	for _, e := range c.Envs(ctx) {
		out.Envs = append(out.Envs, protocol.EnvInfo{EnvID: e.Env.ID, Image: e.Env.Image, Task: e.Task.Name, Origin: e.Env.Origin,
			Head: e.Env.Head(), Turn: e.Turn, IdleS: e.Idle.Seconds(), Recovered: recovered(e.Recovered)})
	}
	for _, l := range c.Lost(ctx) {
		out.Envs = append(out.Envs, protocol.EnvInfo{EnvID: l.ID, Image: l.Image, Task: l.Task.Name, Head: l.Head,
			Lost: protocol.ErrorOf(l.Err).Message})
	}
	sort.Slice(out.Envs, func(i, j int) bool { return out.Envs[i].EnvID < out.Envs[j].EnvID })
	return out, nil
}

func (r *request) states(ctx context.Context, p *protocol.EnvParams) (any, error) {
	return r.server().states(ctx, p.EnvID)
}

// states is the lineage of an env's head; the caller holds the env's
// ticket.
func (s *Server) states(ctx context.Context, envID string) (*protocol.StatesResult, error) {
	head, l, total, err := s.c.States(ctx, envID)
	if err != nil {
		return nil, err
	}
	out := protocol.StatesResult{EnvID: envID, Head: head, Bytes: total, States: make([]protocol.StateInfo, 0, len(l))}
	for _, st := range l {
		out.States = append(out.States, protocol.StateInfo{StateID: st.ID, Parent: st.Parent, EnvID: st.Env,
			Turn: st.Turn, Kind: string(st.Kind), Created: st.Created.Format(time.RFC3339Nano), Bytes: st.Bytes})
	}
	return &out, nil
}

// release, pin and unpin change the retention of states (docs/engine.md,
// "Retention"); they name no env, so they take no ticket.
func (r *request) releaseStates(ctx context.Context, p *protocol.ReleaseParams) (any, error) {
	return protocol.Empty{}, r.server().c.Release(ctx, p.StateIDs)
}

func (r *request) pinStates(ctx context.Context, p *protocol.PinParams) (any, error) {
	return protocol.Empty{}, r.server().c.Pin(ctx, p.StateIDs)
}

func (r *request) unpinStates(ctx context.Context, p *protocol.UnpinParams) (any, error) {
	return protocol.Empty{}, r.server().c.Unpin(ctx, p.StateIDs)
}

// prepare restores frozen copies of states ahead of branches from them
// (docs/protocol.md, "prepare"); it names no env, so it takes no ticket.
// Its params bound n (protocol.MaxPrepareN); the engine's budget bounds
// the copies of all states.
func (r *request) prepare(ctx context.Context, p *protocol.PrepareParams) (any, error) {
	res, err := r.server().c.Prepare(ctx, p.StateIDs, p.N, p.Wait)
	if err != nil {
		return nil, err
	}
	return protocol.PrepareResult{Prepared: res.Prepared, Ready: res.Ready, Refused: res.Refused}, nil
}

// recovered is the protocol's form of a coordinator.Recovered.
func recovered(r *coordinator.Recovered) *protocol.Recovered {
	if r == nil {
		return nil
	}
	return &protocol.Recovered{StateID: r.StateID, Turn: r.Turn}
}

// batchEnvs checks the size of a step_batch and takes each item's ticket,
// in item order.
func batchEnvs(s *Server, r *request, p *protocol.StepBatchParams) ([]string, error) {
	if len(p.Items) > s.o.MaxBatch {
		return nil, state.Errorf(state.ErrInvalidParams, "items: %d items, the limit is %d", len(p.Items), s.o.MaxBatch)
	}
	r.batch = make([]batchItem, len(p.Items))
	for i, it := range p.Items {
		r.batch[i] = batchItem{envID: it.EnvID, action: it.Action, key: it.Key}
		r.batch[i].wait, r.batch[i].release = s.c.Ticket(it.EnvID)
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
			// This goroutine's own recover: run's does not reach it.
			var res *protocol.StepResult
			err := panics.Call(s.log, func() (err error) {
				res, err = s.step(ctx, it.envID, it.action, it.key)
				return err
			}, slog.String("method", protocol.MethodStepBatch), slog.String("env", it.envID))
			it.release()
			br := protocol.BatchItemResult{MsgID: r.msgid, Index: i, EnvID: it.envID, Result: res}
			if err != nil {
				br.Error, br.Result = protocol.ErrorOf(err), nil
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
