package stress

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
	"github.com/arbor-env/arbor/server/protocol"
)

// config bounds a run.
type config struct {
	seed        int64
	clients     int           // connections, each with its own envs
	workers     int           // concurrent request streams per connection
	slowReaders int           // raw websocket clients that leave large answers unread
	duration    time.Duration // how long new requests are sent
	hang        time.Duration // a request not answered within this is a hang
	maxEnvs     int           // envs a client holds at most
	faults      bool          // cut connections and kill sandboxes' inits
}

// run is one stress run against a server.
type run struct {
	cfg config
	s   *server
	g   *cgroups
	rec *recorder
	end time.Time
}

// envState is what a client knows of one of its envs: the value its
// steps wrote (file /work/v and shell variable V), the state ids it may
// roll back to (hist), and the state it is at. Every state of hist is an
// ancestor of the head or one the env made, so it stays branchable and
// the rollback tool accepts it (docs/agent-tools.md); a rollback to
// another env's state starts hist anew (see opClose).
type envState struct {
	id      string
	task    bool // the hello task (has a verifier), else the busybox image
	val     int
	head    string
	hist    []string
	faulted bool // the test killed its init: the next request may answer infra
	trace   []string
}

// String is the env's recent history, for failure messages.
func (e *envState) String() string {
	return fmt.Sprintf("env %s (recent: %s)", e.id, strings.Join(e.trace, ", "))
}

// client is one connection and the envs it drives; its workers share them.
type client struct {
	r     *run
	id    int
	mu    sync.Mutex
	c     *conn
	envs  map[string]*envState
	busy  map[string]bool
	valOf map[string]int // state id -> the value of /work/v and V in it
	next  int
	// abandoned are envs the client dropped from its books (closed, or
	// their state became unknown when a request on them was cut): it
	// closes them, as a trainer drops a sample, so that a long run does not
	// fill the server with envs nobody uses (envs outlive connections).
	abandoned []string
}

func (r *run) newClient(id int) (*client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.hang)
	defer cancel()
	c, err := dial(ctx, r.s.addr)
	if err != nil {
		return nil, err
	}
	return &client{r: r, id: id, c: c, envs: map[string]*envState{}, busy: map[string]bool{}, valOf: map[string]int{}}, nil
}

// conn is the client's connection, a new one after the test cut it.
func (cl *client) conn() *conn {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.c.dropped.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), cl.r.cfg.hang)
		c, err := dial(ctx, cl.r.s.addr)
		cancel()
		if err != nil {
			cl.r.rec.fail("client %d: reconnect after a cut: %v", cl.id, err)
			return cl.c // every call on it fails as dropped
		}
		cl.c = c
	}
	return cl.c
}

// take marks up to n idle envs that pass ok busy and returns them.
func (cl *client) take(rng *rand.Rand, n int, ok func(*envState) bool) []*envState {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var idle []*envState
	for id, e := range cl.envs {
		if !cl.busy[id] && (ok == nil || ok(e)) {
			idle = append(idle, e)
		}
	}
	// map order is not the seed's: sort before shuffling
	sortEnvs(idle)
	rng.Shuffle(len(idle), func(i, j int) { idle[i], idle[j] = idle[j], idle[i] })
	if len(idle) > n {
		idle = idle[:n]
	}
	for _, e := range idle {
		cl.busy[e.id] = true
	}
	return idle
}

func sortEnvs(es []*envState) {
	slices.SortFunc(es, func(a, b *envState) int { return strings.Compare(a.id, b.id) })
}

func (cl *client) put(es ...*envState) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, e := range es {
		delete(cl.busy, e.id)
	}
}

// add registers a new env (idle).
func (cl *client) add(e *envState) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.envs[e.id] = e
	cl.valOf[e.head] = e.val
}

// forget drops an env from the client's books: closed, or its state is
// no longer known (a request on it was cut). The end of the run closes
// what is still open.
func (cl *client) forget(e *envState) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	delete(cl.envs, e.id)
	delete(cl.busy, e.id)
	cl.abandoned = append(cl.abandoned, e.id)
}

// closeAbandoned closes the envs forget dropped. Any answer will do: most
// were closed already (unknown_env), and a cut leaves the rest to the end
// of the run, which closes whatever is still open.
func (cl *client) closeAbandoned() {
	cl.mu.Lock()
	ids := cl.abandoned
	cl.abandoned = nil
	cl.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	c := cl.conn()
	ctx, cancel := context.WithTimeout(context.Background(), cl.r.cfg.hang)
	defer cancel()
	for _, id := range ids {
		c.CloseEnv(ctx, id)
	}
}

func (cl *client) nenvs() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return len(cl.envs)
}

func (cl *client) newVal() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.next++
	return cl.next
}

func (cl *client) stateVal(sid string) (int, bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	v, ok := cl.valOf[sid]
	return v, ok
}

// moved records that e is now at state sid with value val (why: the
// request that moved it, for the failure messages).
func (cl *client) moved(e *envState, sid string, val int, why string) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.valOf[sid] = val
	e.trace = append(e.trace, fmt.Sprintf("%s->%s=%d", why, sid, val))
	if len(e.trace) > 16 {
		e.trace = e.trace[len(e.trace)-12:]
	}
	if e.head == sid {
		e.val = val
		return // not new to its history (it may be a state it only visits)
	}
	e.val, e.head = val, sid
	for _, h := range e.hist {
		if h == sid {
			return
		}
	}
	e.hist = append(e.hist, sid)
}

// do runs one request with the hang limit and records its outcome.
func (cl *client) do(method, what string, e *expect, fn func(ctx context.Context, c *arbor.Client) error) error {
	c := cl.conn()
	ctx, cancel := context.WithTimeout(context.Background(), cl.r.cfg.hang)
	defer cancel()
	start := time.Now()
	return cl.r.rec.check(method, fmt.Sprintf("client %d: %s", cl.id, what), start, c, e, fn(ctx, c.Client))
}

// cut reports whether err means the request got no answer (the
// connection was cut, or it hung): the env's state is then unknown.
func cut(err error) bool {
	var pe *protocol.Error
	return err != nil && !errors.As(err, &pe)
}

func envExpect(e *envState) *expect { return &expect{faulted: e.faulted} }

// op is one kind of request sequence, with its weight in the mix.
type op struct {
	name   string
	weight int
	fn     func(cl *client, rng *rand.Rand)
}

func (r *run) ops() []op {
	ops := []op{
		{"reset", 6, (*client).opReset},
		{"step", 20, (*client).opMutate},
		{"step-check", 14, (*client).opCheck},
		{"files", 4, (*client).opFiles},
		{"branch", 7, (*client).opBranch},
		{"rollback", 7, (*client).opRollback},
		{"rollback-tool", 3, (*client).opRollbackTool},
		{"evaluate", 6, (*client).opEvaluate},
		{"step_batch", 6, (*client).opBatch},
		{"close", 5, (*client).opClose},
		{"states", 3, (*client).opStates},
		{"checkpoint", 2, (*client).opCheckpoint},
		{"envs", 2, (*client).opEnvs},
		{"bad", 5, (*client).opBad},
		{"close-race", 2, (*client).opCloseRace},
		{"pause", 1, (*client).opPause},
	}
	if r.cfg.faults {
		ops = append(ops, op{"kill-init", 1, (*client).opKill}, op{"cut", 1, (*client).opCut})
	}
	return ops
}

// work runs random ops until the run's end.
func (cl *client) work(rng *rand.Rand, ops []op) {
	total := 0
	for _, o := range ops {
		total += o.weight
	}
	for time.Now().Before(cl.r.end) && !cl.r.rec.flooded() {
		cl.closeAbandoned()
		if cl.nenvs() == 0 {
			cl.opReset(rng)
			continue
		}
		n := rng.Intn(total)
		for _, o := range ops {
			if n < o.weight {
				o.fn(cl, rng)
				break
			}
			n -= o.weight
		}
	}
}

func (cl *client) opReset(rng *rand.Rand) {
	if cl.nenvs() >= cl.r.cfg.maxEnvs {
		return
	}
	p := arbor.ResetParams{Image: "busybox"}
	task := rng.Intn(10) < 7
	if task {
		// The load steps an env well past hello's max_turns: no episode
		// end here (reset's options.max_turns 0).
		p = arbor.ResetParams{Task: "hello", Options: map[string]any{"max_turns": 0}}
	}
	var res *arbor.ResetResult
	err := cl.do("reset", fmt.Sprintf("reset %+v", p), nil, func(ctx context.Context, c *arbor.Client) (err error) {
		res, err = c.Reset(ctx, p)
		return err
	})
	if err != nil {
		return
	}
	if res.EnvID == "" || res.Info.StateID == "" {
		cl.r.rec.fail("client %d: reset %+v: no env or state id: %+v", cl.id, p, res)
		return
	}
	cl.add(&envState{id: res.EnvID, task: task, head: res.Info.StateID, hist: []string{res.Info.StateID},
		trace: []string{fmt.Sprintf("reset %+v->%s", p, res.Info.StateID)}})
}

// mutateCmd writes val into /work/v and V, and (hello task) writes the
// greeting for even values, so the verifier's reward follows the value.
func mutateCmd(e *envState, val int, rng *rand.Rand) string {
	cmd := fmt.Sprintf("mkdir -p /work && echo %d > /work/v && export V=%d", val, val)
	if e.task {
		if val%2 == 0 {
			cmd += ` && printf '%s\n' "$GREETING" > /work/hello/greeting.txt`
		} else {
			cmd += " && rm -f /work/hello/greeting.txt"
		}
	}
	if rng.Intn(10) == 0 {
		cmd += "\nsleep 600 </dev/null >/dev/null 2>&1 &" // a background job: process state to checkpoint
	}
	return cmd
}

const checkCmd = `cat /work/v 2>/dev/null || echo 0; echo "${V:-0}"`

func wantCheck(val int) string { return fmt.Sprintf("%d\n%d\n", val, val) }

// wantReward is the hello verifier's reward for a value.
func wantReward(val int) float64 {
	if val > 0 && val%2 == 0 {
		return 1
	}
	return 0
}

// step runs one action on e and returns its result (nil when it failed).
func (cl *client) step(e *envState, what string, a arbor.Action) *arbor.StepResult {
	var res *arbor.StepResult
	ex := envExpect(e)
	err := cl.do("step", fmt.Sprintf("step %s on %s", what, e.id), ex, func(ctx context.Context, c *arbor.Client) (err error) {
		res, err = c.Step(ctx, e.id, a)
		return err
	})
	if cut(err) {
		cl.forget(e)
		return nil
	}
	if err != nil {
		if ex.faulted && errors.Is(err, arbor.ErrSandbox) {
			cl.r.rec.note("step after its init was killed answered sandbox_failed")
			if !strings.Contains(err.Error(), "restored to state "+e.head) {
				cl.r.rec.fail("client %d: step on %s after its init was killed: %v, want the env restored at its committed head %s", cl.id, e.id, err, e.head)
			}
			e.faulted = false
		}
		return nil
	}
	e.faulted = false
	if res.Info.CheckpointError != "" {
		cl.r.rec.fail("client %d: step %s on %s: checkpoint_error without a fault: %s", cl.id, what, e.id, res.Info.CheckpointError)
	}
	return res
}

func (cl *client) opMutate(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	defer cl.put(e)
	val := cl.newVal()
	cmd := mutateCmd(e, val, rng)
	if res := cl.step(e, "write value", arbor.Bash(cmd, 0)); res != nil {
		if res.Obs.ExitCode != 0 {
			cl.r.rec.fail("client %d: step %q on %s: exit %d: %s", cl.id, cmd, e.id, res.Obs.ExitCode, res.Obs.Stderr)
			return
		}
		cl.moved(e, res.Info.StateID, val, "step")
	}
}

// verify checks that e's shell and files hold its value.
func (cl *client) verify(e *envState, why string) {
	res := cl.step(e, "check value", arbor.Bash(checkCmd, 0))
	if res == nil {
		return
	}
	cl.r.rec.note("step saw the value of its state (" + why + ")")
	if got := string(res.Obs.Stdout); got != wantCheck(e.val) {
		cl.r.rec.fail("client %d: %s (%s, head %s): /work/v and $V read %q, want %q", cl.id, e, why, e.head, got, wantCheck(e.val))
	}
	if res.Info.StateID != e.head {
		// Not a lie (when in doubt the server checkpoints), but counted.
		cl.r.rec.note("read-only step made a new state")
		cl.moved(e, res.Info.StateID, e.val, "read-only step")
	}
}

func (cl *client) opCheck(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	defer cl.put(es[0])
	cl.verify(es[0], "step")
}

func (cl *client) opFiles(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	defer cl.put(e)
	content := make([]byte, rng.Intn(4096))
	rng.Read(content)
	res := cl.step(e, "write_file", arbor.WriteFile("/work/f", content))
	if res == nil {
		return
	}
	cl.moved(e, res.Info.StateID, e.val, "write_file")
	res = cl.step(e, "read_file", arbor.ReadFile("/work/f"))
	if res == nil {
		return
	}
	cl.moved(e, res.Info.StateID, e.val, "read_file")
	if string(res.Obs.Stdout) != string(content) {
		cl.r.rec.fail("client %d: read_file on %s returned %d bytes unlike the %d written", cl.id, e.id, len(res.Obs.Stdout), len(content))
	}
}

func (cl *client) opBranch(rng *rand.Rand) {
	n := 1 + rng.Intn(2)
	if cl.nenvs()+n > cl.r.cfg.maxEnvs {
		return
	}
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	src := es[0]
	defer cl.put(src)
	p := arbor.BranchParams{EnvID: src.id, N: n}
	val := src.val
	// A task env's first state is its task's prepared one: a branch of
	// it is a new episode under the task's max_turns, which this load
	// would pass (docs/protocol.md, reset's options); its later states
	// keep the env's own limit (none here).
	first := 0
	if src.task {
		first = 1
	}
	if rng.Intn(2) == 0 && len(src.hist) > first {
		p = arbor.BranchParams{StateID: src.hist[first+rng.Intn(len(src.hist)-first)], N: n}
		val, _ = cl.stateVal(p.StateID)
	}
	var res *arbor.BranchResult
	err := cl.do("branch", fmt.Sprintf("branch %+v of %s", p, src), envExpect(src), func(ctx context.Context, c *arbor.Client) (err error) {
		res, err = c.Branch(ctx, p)
		return err
	})
	if cut(err) {
		cl.forget(src)
		return
	}
	if err != nil {
		return
	}
	if p.EnvID != "" {
		cl.moved(src, res.StateID, val, "branch source")
	}
	for i, id := range res.EnvIDs {
		if id == "" {
			var ie error = errors.New("no error given")
			if i < len(res.Errors) && res.Errors[i] != nil {
				ie = res.Errors[i]
			}
			cl.r.rec.check("branch child", fmt.Sprintf("client %d: branch %+v child %d", cl.id, p, i), time.Time{}, nil, envExpect(src), ie)
			continue
		}
		child := &envState{id: id, task: src.task}
		cl.moved(child, res.StateID, val, "branch of "+src.id)
		cl.add(child)
	}
}

func (cl *client) opRollback(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	defer cl.put(e)
	sid := e.hist[rng.Intn(len(e.hist))]
	val, _ := cl.stateVal(sid)
	var info *arbor.Info
	err := cl.do("rollback", fmt.Sprintf("rollback %s to %s", e, sid), envExpect(e), func(ctx context.Context, c *arbor.Client) (err error) {
		info, err = c.Rollback(ctx, e.id, sid)
		return err
	})
	if cut(err) {
		cl.forget(e)
		return
	}
	if err != nil {
		return
	}
	if info.StateID != sid || info.Restored != sid {
		cl.r.rec.fail("client %d: rollback %s to %s answered state %s restored %s", cl.id, e.id, sid, info.StateID, info.Restored)
	}
	cl.moved(e, sid, val, "rollback")
	if rng.Intn(2) == 0 {
		cl.verify(e, "rollback")
	}
}

func (cl *client) opRollbackTool(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	defer cl.put(e)
	sid := e.hist[rng.Intn(len(e.hist))]
	val, _ := cl.stateVal(sid)
	res := cl.step(e, fmt.Sprintf("rollback tool to %s (%s)", sid, e), arbor.RollbackTo(sid))
	if res == nil {
		return
	}
	if res.Obs.ExitCode != 0 || res.Info.Restored != sid {
		cl.r.rec.fail("client %d: rollback tool on %s to %s (a state of its own): exit %d restored %q: %s", cl.id, e.id, sid, res.Obs.ExitCode, res.Info.Restored, res.Obs.Stderr)
		return
	}
	cl.moved(e, res.Info.StateID, val, "rollback tool")
	cl.verify(e, "rollback tool")
}

func (cl *client) opEvaluate(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	defer cl.put(e)
	ex := envExpect(e)
	if !e.task {
		ex.codes = []string{protocol.CodeBadRequest} // no verifier
	}
	var ev *arbor.Evaluation
	err := cl.do("evaluate", "evaluate "+e.id, ex, func(ctx context.Context, c *arbor.Client) (err error) {
		ev, err = c.Evaluate(ctx, e.id)
		return err
	})
	if cut(err) {
		cl.forget(e)
		return
	}
	if err != nil {
		return
	}
	e.faulted = false
	if !e.task {
		cl.r.rec.fail("client %d: evaluate of %s (an image env, no verifier) answered %+v, want bad_request", cl.id, e.id, ev)
		return
	}
	cl.r.rec.note("evaluate scored the env's state")
	if ev.Reward != wantReward(e.val) {
		cl.r.rec.fail("client %d: evaluate of %s at value %d (state %s): reward %v, want %v (%v)", cl.id, e, e.val, e.head, ev.Reward, wantReward(e.val), ev.Details)
	}
}

func (cl *client) opBatch(rng *rand.Rand) {
	es := cl.take(rng, 2+rng.Intn(3), nil)
	if len(es) == 0 {
		return
	}
	defer cl.put(es...)
	type item struct {
		e   *envState
		val int // the value it writes, 0 for a check
	}
	var items []item
	var batch []arbor.BatchItem
	for i, e := range es {
		n := 1
		if i == 0 {
			n = 2 // two items on one env run in item order
		}
		for k := 0; k < n; k++ {
			if k == 0 && rng.Intn(2) == 0 {
				val := cl.newVal()
				items = append(items, item{e, val})
				batch = append(batch, arbor.BatchItem{EnvID: e.id, Action: arbor.Bash(mutateCmd(e, val, rng), 0)})
			} else {
				items = append(items, item{e, 0})
				batch = append(batch, arbor.BatchItem{EnvID: e.id, Action: arbor.Bash(checkCmd, 0)})
			}
		}
	}
	ex := &expect{}
	for _, e := range es {
		ex.faulted = ex.faulted || e.faulted
	}
	var res *arbor.StepBatchResult
	var mu sync.Mutex
	notified := 0
	err := cl.do("step_batch", fmt.Sprintf("step_batch of %d items", len(batch)), nil, func(ctx context.Context, c *arbor.Client) (err error) {
		res, err = c.StepBatch(ctx, batch, func(arbor.BatchItemResult) { mu.Lock(); notified++; mu.Unlock() })
		return err
	})
	if cut(err) {
		for _, e := range es {
			cl.forget(e)
		}
		return
	}
	if err != nil {
		return
	}
	mu.Lock()
	if notified != len(batch) {
		cl.r.rec.fail("client %d: step_batch of %d items sent %d item notifications", cl.id, len(batch), notified)
	}
	mu.Unlock()
	if len(res.Results) != len(batch) {
		cl.r.rec.fail("client %d: step_batch of %d items answered %d results", cl.id, len(batch), len(res.Results))
		return
	}
	for i, it := range items {
		r := res.Results[i]
		var ie error
		if r.Error != nil {
			ie = r.Error
		}
		ierr := cl.r.rec.check("step_batch item", fmt.Sprintf("client %d: step_batch item %d on %s", cl.id, i, it.e.id), time.Time{}, nil, envExpect(it.e), ie)
		if ierr != nil || r.Result == nil {
			continue
		}
		it.e.faulted = false
		if it.val != 0 {
			if r.Result.Obs.ExitCode != 0 {
				cl.r.rec.fail("client %d: step_batch item %d on %s: exit %d: %s", cl.id, i, it.e.id, r.Result.Obs.ExitCode, r.Result.Obs.Stderr)
				continue
			}
			cl.moved(it.e, r.Result.Info.StateID, it.val, "batch step")
			continue
		}
		if got := string(r.Result.Obs.Stdout); got != wantCheck(it.e.val) {
			cl.r.rec.fail("client %d: step_batch item %d: env %s (head %s) reads %q, want %q", cl.id, i, it.e.id, it.e.head, got, wantCheck(it.e.val))
		}
		cl.moved(it.e, r.Result.Info.StateID, it.e.val, "batch read-only step")
	}
}

func (cl *client) opClose(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	err := cl.do("close", "close "+e.id, envExpect(e), func(ctx context.Context, c *arbor.Client) error {
		return c.CloseEnv(ctx, e.id)
	})
	cl.forget(e)
	if err != nil || rng.Intn(3) != 0 {
		return
	}
	// A closed env is unknown; its states are released unless a live
	// env's lineage holds them: either answer is honest, infra is not.
	cl.do("step", "step on closed "+e.id, &expect{codes: []string{protocol.CodeUnknownEnv}}, func(ctx context.Context, c *arbor.Client) error {
		_, err := c.Step(ctx, e.id, arbor.Bash("true", 0))
		if err == nil {
			return errors.New("a step on a closed env succeeded")
		}
		return err
	})
	// Of the same kind: a task env at an image env's state has no
	// /work/hello for the value steps to write the greeting into.
	others := cl.take(rng, 1, func(o *envState) bool { return o.task == e.task })
	if len(others) == 0 {
		return
	}
	o := others[0]
	defer cl.put(o)
	sid := e.hist[rng.Intn(len(e.hist))]
	val, _ := cl.stateVal(sid)
	err = cl.do("rollback", fmt.Sprintf("rollback %s to %s of closed %s", o.id, sid, e.id), &expect{codes: []string{protocol.CodeUnknownState}, faulted: o.faulted},
		func(ctx context.Context, c *arbor.Client) error {
			_, err := c.Rollback(ctx, o.id, sid)
			return err
		})
	if cut(err) {
		cl.forget(o)
		return
	}
	if err == nil {
		// o's earlier history that it did not make (its branch point, a
		// task's post-setup state) is no longer an ancestor of its head:
		// once their makers are closed, nothing holds those states, and
		// unknown_state is the honest answer for them. hist starts anew
		// at sid, which o's later states descend from.
		cl.mu.Lock()
		o.val, o.head, o.hist = val, sid, []string{sid}
		cl.valOf[sid] = val
		o.trace = append(o.trace, fmt.Sprintf("rollback to %s of closed %s->%s=%d", sid, e.id, sid, val))
		cl.mu.Unlock()
		cl.verify(o, "rollback to a state of a closed env")
	}
}

func (cl *client) opStates(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	defer cl.put(e)
	var st *arbor.StatesResult
	err := cl.do("states", "states "+e.id, envExpect(e), func(ctx context.Context, c *arbor.Client) (err error) {
		st, err = c.States(ctx, e.id)
		return err
	})
	if cut(err) {
		cl.forget(e)
		return
	}
	if err == nil && st.Head != e.head {
		cl.r.rec.fail("client %d: states of %s: head %s, want %s (the state its last request returned)", cl.id, e.id, st.Head, e.head)
	}
}

func (cl *client) opCheckpoint(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	defer cl.put(e)
	var sid string
	err := cl.do("checkpoint", "checkpoint "+e.id, envExpect(e), func(ctx context.Context, c *arbor.Client) (err error) {
		sid, err = c.Checkpoint(ctx, e.id)
		return err
	})
	if cut(err) {
		cl.forget(e)
		return
	}
	if err == nil {
		cl.moved(e, sid, e.val, "checkpoint")
	}
}

func (cl *client) opEnvs(rng *rand.Rand) {
	// The envs open before the request and untouched until its answer
	// must be listed.
	cl.mu.Lock()
	before := map[string]bool{}
	for id := range cl.envs {
		if !cl.busy[id] {
			before[id] = true
		}
	}
	cl.mu.Unlock()
	var list []arbor.EnvInfo
	err := cl.do("envs", "envs", nil, func(ctx context.Context, c *arbor.Client) (err error) {
		list, err = c.Envs(ctx)
		return err
	})
	if err != nil {
		return
	}
	open := map[string]bool{}
	for _, e := range list {
		open[e.EnvID] = true
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for id := range cl.envs {
		if before[id] && !cl.busy[id] && !open[id] {
			cl.r.rec.fail("client %d: envs does not list its open env %s", cl.id, id)
		}
	}
}

// opBad sends a deliberate mistake: it must answer the client error for
// it, never infra.
func (cl *client) opBad(rng *rand.Rand) {
	env := "000000000000"
	if es := cl.take(rng, 1, nil); len(es) > 0 {
		env = es[0].id
		defer cl.put(es[0])
	}
	type bad struct {
		what   string
		method string
		params any
		want   *expect
	}
	cases := []bad{
		{"step on an unknown env", protocol.MethodStep, protocol.StepParams{EnvID: "000000000000", Action: arbor.Bash("true", 0)}, &expect{codes: []string{protocol.CodeUnknownEnv}}},
		{"bash without cmd", protocol.MethodStep, map[string]any{"env_id": env, "action": map[string]any{"tool": "bash"}}, &expect{codes: []string{protocol.CodeInvalidParams}}},
		{"unknown tool", protocol.MethodStep, map[string]any{"env_id": env, "action": map[string]any{"tool": "frob"}}, &expect{codes: []string{protocol.CodeInvalidParams}}},
		{"branch n=-1", protocol.MethodBranch, map[string]any{"env_id": env, "n": -1}, &expect{codes: []string{protocol.CodeInvalidParams}}},
		{"rollback to an unknown state", protocol.MethodRollback, protocol.RollbackParams{EnvID: env, StateID: "s000000000000"}, &expect{codes: []string{protocol.CodeUnknownState, protocol.CodeUnknownEnv}}},
		{"branch of an unknown state", protocol.MethodBranch, protocol.BranchParams{StateID: "s000000000000", N: 1}, &expect{codes: []string{protocol.CodeUnknownState}}},
		{"reset of an unknown image", protocol.MethodReset, arbor.ResetParams{Image: "nope"}, &expect{anyUser: true}},
		{"reset of an unknown task", protocol.MethodReset, arbor.ResetParams{Task: "nope"}, &expect{codes: []string{protocol.CodeUnknownTask}}},
		{"evaluate of an unknown env", protocol.MethodEvaluate, protocol.EnvParams{EnvID: "000000000000"}, &expect{codes: []string{protocol.CodeUnknownEnv}}},
		{"unknown method", "frobnicate", nil, &expect{codes: []string{protocol.CodeUnknownMethod}}},
		{"env_id of the wrong type", protocol.MethodStates, map[string]any{"env_id": 7}, &expect{codes: []string{protocol.CodeInvalidParams}}},
	}
	b := cases[rng.Intn(len(cases))]
	err := cl.do(b.method, "bad input: "+b.what, b.want, func(ctx context.Context, c *arbor.Client) error {
		err := c.Call(ctx, b.method, b.params, nil)
		if err == nil {
			return errors.New("bad input accepted")
		}
		return err
	})
	cl.r.rec.note("bad input answered")
	if cut(err) && env != "000000000000" {
		cl.mu.Lock()
		e := cl.envs[env]
		cl.mu.Unlock()
		if e != nil {
			cl.forget(e)
		}
	}
}

// opCloseRace is issue 12's false infra error: a step, then close and a
// branch of the step's state pipelined behind it. The branch either wins
// (a child at that state) or finds the state released: unknown_state,
// never restore_failed.
func (cl *client) opCloseRace(rng *rand.Rand) {
	if cl.nenvs() >= cl.r.cfg.maxEnvs {
		return
	}
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	val := cl.newVal()
	res := cl.step(e, "write value", arbor.Bash(mutateCmd(e, val, rng), 0))
	if res == nil {
		cl.put(e)
		return
	}
	sid := res.Info.StateID
	cl.moved(e, sid, val, "close-race step")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		cl.do("close", "close "+e.id+" (pipelined with a branch of its state)", nil, func(ctx context.Context, c *arbor.Client) error {
			return c.CloseEnv(ctx, e.id)
		})
	}()
	time.Sleep(time.Duration(rng.Intn(3)) * time.Millisecond)
	var br *arbor.BranchResult
	err := cl.do("branch", fmt.Sprintf("branch of %s pipelined behind close of %s", sid, e.id), &expect{codes: []string{protocol.CodeUnknownState}},
		func(ctx context.Context, c *arbor.Client) (err error) {
			br, err = c.Branch(ctx, arbor.BranchParams{StateID: sid, N: 1})
			return err
		})
	wg.Wait()
	cl.forget(e)
	cl.r.rec.note("close raced a branch of its state")
	if err != nil {
		return
	}
	for _, id := range br.EnvIDs {
		if id != "" {
			child := &envState{id: id, task: e.task}
			cl.moved(child, br.StateID, val, "branch racing close of "+e.id)
			cl.add(child)
		}
	}
}

// opPause stops reading the connection's answers for a while: the
// client is a slow reader; requests go on.
func (cl *client) opPause(rng *rand.Rand) {
	cl.conn().pause(time.Duration(500+rng.Intn(3000)) * time.Millisecond)
	cl.r.rec.note("connection paused (answers left unread)")
}

// opKill kills the init of one env's sandbox from the host (an injected
// fault) once its head is committed: the next step may answer
// sandbox_failed naming that head, and the env goes on at it.
func (cl *client) opKill(rng *rand.Rand) {
	es := cl.take(rng, 1, nil)
	if len(es) == 0 {
		return
	}
	e := es[0]
	defer cl.put(e)
	var st *arbor.StatesResult
	err := cl.do("states", "states "+e.id+" (before killing its init)", nil, func(ctx context.Context, c *arbor.Client) (err error) {
		st, err = c.States(ctx, e.id)
		return err
	})
	if cut(err) {
		cl.forget(e)
		return
	}
	if err != nil {
		return
	}
	if st.Head != e.head {
		cl.r.rec.fail("client %d: states of %s: head %s, want %s", cl.id, e.id, st.Head, e.head)
		return
	}
	ok, err := servetest.KillInit(e.id)
	if err != nil || !ok {
		cl.r.rec.fail("client %d: kill the init of %s: found %v: %v", cl.id, e.id, ok, err)
		return
	}
	cl.r.rec.fault("sandbox init killed from the host")
	e.faulted = true
	cl.verify(e, "after its init was killed")
	if e.faulted {
		return // that step was cut
	}
	cl.verify(e, "revived after its init was killed")
}

// opCut cuts the connection abruptly while the other workers' requests
// are in flight; their envs' states are then unknown to the client.
func (cl *client) opCut(rng *rand.Rand) {
	cl.mu.Lock()
	c := cl.c
	cl.mu.Unlock()
	if c.dropped.Load() {
		return
	}
	cl.r.rec.fault("connection cut")
	c.drop()
}
