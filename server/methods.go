package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server/protocol"
)

// request is one request being served.
type request struct {
	c             *conn
	msgid         uint32
	method        string
	p             *params
	wait, release func()
	// batch holds the parsed items of a step_batch, each with its ticket.
	batch []batchItem
}

type batchItem struct {
	envID         string
	action        protocol.Action
	wait, release func()
}

// handler serves one method. envs names the envs whose tickets the request
// takes; it runs on the read loop (parse only, no blocking).
type handler struct {
	envs func(s *Server, r *request) []string
	fn   func(r *request, ctx context.Context) (any, error)
	// self: the handler orders itself (per-item tickets).
	self bool
}

var handlers map[string]handler

func noEnvs(*Server, *request) []string { return nil }

func envIDParam(_ *Server, r *request) []string { return []string{r.p.str("env_id", true)} }

func init() {
	handlers = map[string]handler{
		protocol.MethodHello:      {envs: noEnvs, fn: (*request).hello},
		protocol.MethodReset:      {envs: noEnvs, fn: (*request).reset},
		protocol.MethodStep:       {envs: envIDParam, fn: (*request).step},
		protocol.MethodBranch:     {envs: branchEnvs, fn: (*request).branch},
		protocol.MethodCheckpoint: {envs: envIDParam, fn: (*request).checkpoint},
		protocol.MethodRollback:   {envs: envIDParam, fn: (*request).rollback},
		protocol.MethodPromote:    {envs: promoteEnvs, fn: (*request).promote},
		protocol.MethodDiscard:    {envs: envIDParam, fn: (*request).discard},
		protocol.MethodEvaluate:   {envs: envIDParam, fn: (*request).evaluate},
		protocol.MethodClose:      {envs: envIDParam, fn: (*request).close},
		protocol.MethodEnvs:       {envs: noEnvs, fn: (*request).envs},
		protocol.MethodStates:     {envs: envIDParam, fn: (*request).states},
		protocol.MethodStepBatch:  {envs: batchEnvs, fn: (*request).stepBatch, self: true},
	}
}

func (r *request) server() *Server { return r.c.s }

func (r *request) hello(ctx context.Context) (any, error) {
	s := r.server()
	if tok := r.p.str("token", false); !r.c.authed.Load() {
		if !s.authorized(tok) || tok == "" {
			return nil, protocol.Errorf(protocol.CodeUnauthorized, "wrong or missing token")
		}
		r.c.authed.Store(true)
	}
	kinds := []string{string(branch.None), string(branch.FS), string(branch.Proc), string(branch.Full)}
	return protocol.HelloResult{Version: protocol.Version, Server: "arbor " + s.o.Version, Capabilities: protocol.Capabilities{
		Methods: protocol.Methods, Tools: protocol.Tools, CheckpointKinds: kinds, Tasks: s.c.TaskNames(),
		MaxFrameBytes: s.o.MaxFrameBytes, MaxInFlight: s.o.MaxInFlight, MaxEnvs: s.c.MaxEnvs(), MaxBatch: s.o.MaxBatch,
	}}, nil
}

func (r *request) reset(ctx context.Context) (any, error) {
	req := coordinator.ResetRequest{Image: r.p.str("image", false), Task: r.p.str("task", false)}
	seed := r.p.int64("seed", false, 0)
	r.p.sub("options", false) // accepted for forward compatibility
	if err := r.p.err(); err != nil {
		return nil, err
	}
	req.Seed = seed
	res, err := r.server().c.Reset(ctx, req)
	if err != nil {
		return nil, err
	}
	info := protocol.Info{StateID: res.StateID, Turn: 0, Checkpoint: string(branch.Full), Task: res.Task.Name, Image: res.Task.Image, MaxTurns: res.Task.MaxTurns}
	if r.p.has("seed") {
		info.Seed = &seed
	}
	return protocol.ResetResult{EnvID: res.Env.ID, Obs: protocol.Obs{Stdout: protocol.Text(res.Instruction), Instruction: res.Instruction}, Info: info}, nil
}

func (r *request) step(ctx context.Context) (any, error) {
	envID := r.p.str("env_id", true)
	a := r.p.action("action")
	if err := r.p.err(); err != nil {
		return nil, err
	}
	return r.server().step(ctx, envID, a)
}

// step runs one action as a turn of the coordinator; the caller holds the
// env's ticket.
func (s *Server) step(ctx context.Context, envID string, a protocol.Action) (*protocol.StepResult, error) {
	t, err := s.c.Turn(ctx, envID, coordinator.Action{Tool: a.Tool, Cmd: a.Cmd, Path: a.Path, Content: a.Content, StateID: a.StateID,
		Timeout: time.Duration(a.TimeoutS * float64(time.Second)), MaxOutput: a.MaxOutput})
	if err != nil {
		return nil, err
	}
	res := t.Result
	info := protocol.Info{Tool: a.Tool, StateID: t.StateID, Turn: t.Turn, Checkpoint: string(t.Kind), Task: t.Task.Name, MaxTurns: t.Task.MaxTurns,
		Restored: t.Restored, VerifyMisses: t.VerifyMisses}
	if a.Tool != protocol.ToolRollback {
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

func branchEnvs(_ *Server, r *request) []string {
	if id := r.p.str("env_id", false); id != "" {
		return []string{id}
	}
	return nil
}

func (r *request) branch(ctx context.Context) (any, error) {
	envID, sid := r.p.str("env_id", false), r.p.str("state_id", false)
	n := int(r.p.int64("n", true, 0))
	if err := r.p.err(); err != nil {
		return nil, err
	}
	res, err := r.server().c.Branch(ctx, coordinator.BranchRequest{EnvID: envID, StateID: sid, N: n})
	if err != nil {
		return nil, err
	}
	out := protocol.BranchResult{EnvIDs: make([]string, n), StateID: res.State, TookS: res.Took.Seconds()}
	for i, c := range res.Children {
		if c == nil {
			if out.Errors == nil {
				out.Errors = make([]*protocol.Error, n)
			}
			out.Errors[i] = coordinator.ProtoError(res.Errors[i])
			continue
		}
		out.EnvIDs[i] = c.ID
	}
	return out, nil
}

func (r *request) checkpoint(ctx context.Context) (any, error) {
	sid, err := r.server().c.Checkpoint(ctx, r.p.str("env_id", true))
	if err != nil {
		return nil, err
	}
	return protocol.CheckpointResult{StateID: sid}, nil
}

func (r *request) rollback(ctx context.Context) (any, error) {
	envID, sid := r.p.str("env_id", true), r.p.str("state_id", true)
	if err := r.p.err(); err != nil {
		return nil, err
	}
	res, err := r.server().c.Rollback(ctx, envID, sid)
	if err != nil {
		return nil, err
	}
	return protocol.RollbackResult{Info: protocol.Info{StateID: res.StateID, Turn: res.Turn, Checkpoint: string(branch.None), Restored: res.StateID,
		Task: res.Task.Name, MaxTurns: res.Task.MaxTurns}}, nil
}

func promoteEnvs(s *Server, r *request) []string {
	id := r.p.str("env_id", true)
	ids := []string{id}
	if env, err := s.c.Engine().Env(id); err == nil && env.Origin != "" {
		ids = append(ids, env.Origin)
	}
	return ids
}

func (r *request) promote(ctx context.Context) (any, error) {
	origin, sid, err := r.server().c.Promote(ctx, r.p.str("env_id", true))
	if err != nil {
		return nil, err
	}
	return protocol.PromoteResult{EnvID: origin, StateID: sid}, nil
}

func (r *request) discard(ctx context.Context) (any, error) {
	if err := r.server().c.Discard(ctx, r.p.str("env_id", true)); err != nil {
		return nil, err
	}
	return protocol.Empty{}, nil
}

func (r *request) evaluate(ctx context.Context) (any, error) {
	ev, err := r.server().c.Evaluate(ctx, r.p.str("env_id", true))
	if err != nil {
		return nil, err
	}
	return protocol.Evaluation{Reward: ev.Reward, Details: ev.Details}, nil
}

func (r *request) close(ctx context.Context) (any, error) {
	if err := r.server().c.CloseEnv(ctx, r.p.str("env_id", true)); err != nil {
		return nil, err
	}
	return protocol.Empty{}, nil
}

func (r *request) envs(ctx context.Context) (any, error) {
	out := protocol.EnvsResult{Envs: []protocol.EnvInfo{}}
	for _, e := range r.server().c.Envs() {
		out.Envs = append(out.Envs, protocol.EnvInfo{EnvID: e.Env.ID, Image: e.Env.Image, Task: e.Task.Name, Origin: e.Env.Origin,
			Head: e.Env.Head(), Turn: e.Turn, IdleS: e.Idle.Seconds()})
	}
	return out, nil
}

func (r *request) states(ctx context.Context) (any, error) {
	envID := r.p.str("env_id", true)
	head, l, err := r.server().c.States(ctx, envID)
	if err != nil {
		return nil, err
	}
	out := protocol.StatesResult{EnvID: envID, Head: head, States: make([]protocol.StateInfo, 0, len(l))}
	for _, st := range l {
		out.States = append(out.States, protocol.StateInfo{StateID: st.ID, Parent: st.Parent, EnvID: st.Env,
			Turn: st.Turn, Kind: string(st.Kind), Created: st.Created.Format(time.RFC3339Nano)})
	}
	return out, nil
}

// batchEnvs parses the items of a step_batch and takes each item's ticket,
// in item order.
func batchEnvs(s *Server, r *request) []string {
	items := r.p.list("items", true)
	if len(items) > s.o.MaxBatch {
		r.p.fail("items", "%d items, the limit is %d", len(items), s.o.MaxBatch)
		return nil
	}
	r.batch = make([]batchItem, 0, len(items))
	for i, it := range items {
		m, ok := it.(map[string]any)
		if !ok {
			r.p.fail(fmt.Sprintf("items[%d]", i), "want map, got %s", typeName(it))
			continue
		}
		ip := &params{m: m, path: fmt.Sprintf("items[%d].", i), errs: r.p.errs}
		bi := batchItem{envID: ip.str("env_id", true), action: ip.action("action")}
		r.batch = append(r.batch, bi)
	}
	if r.p.err() != nil {
		return nil
	}
	for i := range r.batch {
		r.batch[i].wait, r.batch[i].release = s.c.Ticket(r.batch[i].envID)
	}
	return nil
}

func (r *request) stepBatch(ctx context.Context) (any, error) {
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
				br.Error, br.Result = coordinator.ProtoError(err), nil
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
