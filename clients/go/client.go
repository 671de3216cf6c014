// Package arbor is the Go client of Arbor's protocol v1: one websocket,
// many concurrent calls matched by msgid (pipelining), typed methods,
// contexts for cancellation, and step_batch results streamed as they
// finish.
//
//	c, err := arbor.Dial(ctx, "127.0.0.1:7878", nil)
//	r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
//	s, err := c.Step(ctx, r.EnvID, arbor.Bash("echo hi", 0))
//
// Errors the server sent are *protocol.Error (aliased here as Error);
// test them with errors.Is against the Err* sentinels, and IsInfra tells
// an infrastructure failure (mask it) from a bad request.
package arbor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// Protocol types, under the client's name.
type (
	Error            = protocol.Error
	Action           = protocol.Action
	Obs              = protocol.Obs
	Info             = protocol.Info
	ResetParams      = protocol.ResetParams
	ResetResult      = protocol.ResetResult
	StepResult       = protocol.StepResult
	BranchParams     = protocol.BranchParams
	BranchResult     = protocol.BranchResult
	RollbackResult   = protocol.RollbackResult
	PromoteResult    = protocol.PromoteResult
	MigrateResult    = protocol.MigrateResult
	Evaluation       = protocol.Evaluation
	EnvInfo          = protocol.EnvInfo
	StateInfo        = protocol.StateInfo
	StatesResult     = protocol.StatesResult
	HelloResult      = protocol.HelloResult
	BatchItem        = protocol.BatchItem
	BatchItemResult  = protocol.BatchItemResult
	StepBatchResult  = protocol.StepBatchResult
	CheckpointResult = protocol.CheckpointResult
	Recovered        = protocol.Recovered
	PrepareResult    = protocol.PrepareResult
	TasksParams      = protocol.TasksParams
	TasksResult      = protocol.TasksResult
)

// Sentinels for errors.Is.
var (
	ErrUnknownEnv    = protocol.ErrUnknownEnv
	ErrUnknownState  = protocol.ErrUnknownState
	ErrInvalidParams = protocol.ErrInvalidParams
	ErrBadRequest    = protocol.ErrBadRequest
	ErrTooManyEnvs   = protocol.ErrTooManyEnvs
	ErrNoSpace       = protocol.ErrNoSpace
	ErrTooManyReqs   = protocol.ErrTooManyReqs
	ErrUnauthorized  = protocol.ErrUnauthorized
	ErrShuttingDown  = protocol.ErrShuttingDown
	ErrEnvLost       = protocol.ErrEnvLost
	ErrSandbox       = protocol.ErrSandbox
	// ErrNodeUnavailable: a cluster router could not reach the node of
	// the env or state (retryable, infra).
	ErrNodeUnavailable = protocol.ErrNodeUnavailable
	// ErrOverBudget: none of the copies a prepare asked for fit in the
	// server's budget of prepared copies (retryable).
	ErrOverBudget = protocol.ErrOverBudget
	// ErrVerifierError: the task's verifier result is no reward under the
	// task's rules (docs/tasks.md, "Reward").
	ErrVerifierError = protocol.ErrVerifierError
	// ErrClosed: the connection is closed.
	ErrClosed = errors.New("arbor: connection closed")
)

// IsInfra reports whether err is an infrastructure failure of the server.
func IsInfra(err error) bool { return protocol.IsInfra(err) }

// Bash is a bash action (timeout 0: the task's or server's default).
func Bash(cmd string, timeout time.Duration) Action {
	return Action{Tool: state.ToolBash, Cmd: cmd, TimeoutS: timeout.Seconds()}
}

// WriteFile is a write_file action.
func WriteFile(path string, content []byte) Action {
	return Action{Tool: state.ToolWriteFile, Path: path, Content: content}
}

// ReadFile is a read_file action.
func ReadFile(path string) Action { return Action{Tool: state.ToolReadFile, Path: path} }

// RollbackTo is the rollback tool: the agent returns to a state it saw.
func RollbackTo(stateID string) Action { return Action{Tool: state.ToolRollback, StateID: stateID} }

// Options tune Dial.
type Options struct {
	// Token is sent as a bearer token.
	Token string
	// OnNotification receives server notifications other than
	// step_batch items (e.g. "error" for a frame the server could not
	// attribute). It runs on the read loop: keep it short.
	OnNotification func(method string, params []byte)
	// BusyRetries is how many times a call answered too_many_requests
	// with a retry_after_ms hint (the server's admission control was
	// busy: docs/protocol.md, Errors) is sent again, each after the hint
	// plus up to half of it again at random, so clients that were refused
	// together do not come back together (default 8; negative: none).
	// A too_many_requests without a hint (this connection's own
	// max_in_flight) is returned at once. BusyMaxWait bounds the time spent waiting on them (default
	// 60 s); past either, the call returns the last busy answer. A busy
	// answer means the request did not run, so sending it again is safe.
	// Send does not retry, nor does StepBatch retry its items (a busy
	// item is in its result: send it again after its RetryAfter).
	BusyRetries int
	BusyMaxWait time.Duration
}

// Client is one connection to an Arbor server, safe for concurrent use.
type Client struct {
	ws   *websocket.Conn
	opts Options
	wmu  sync.Mutex

	mu      sync.Mutex
	next    uint32
	pending map[uint32]chan protocol.Frame
	batches map[uint32]func(BatchItemResult)
	err     error
	done    chan struct{}
}

// URL turns "host:port", "http://host:port" or a full ws:// URL into the
// websocket URL of the server.
func URL(server string) string {
	u := server
	switch {
	case strings.HasPrefix(u, "http://"):
		u = "ws://" + strings.TrimPrefix(u, "http://")
	case strings.HasPrefix(u, "https://"):
		u = "wss://" + strings.TrimPrefix(u, "https://")
	case !strings.HasPrefix(u, "ws://") && !strings.HasPrefix(u, "wss://"):
		u = "ws://" + u
	}
	if i := strings.Index(strings.SplitN(u, "://", 2)[1], "/"); i < 0 {
		u += "/v1/ws"
	}
	return u
}

// Dial connects to server (see URL for the forms it takes).
func Dial(ctx context.Context, server string, o *Options) (*Client, error) {
	var opts Options
	if o != nil {
		opts = *o
	}
	h := http.Header{}
	if opts.Token != "" {
		h.Set("Authorization", "Bearer "+opts.Token)
	}
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second, ReadBufferSize: 64 << 10, WriteBufferSize: 64 << 10}
	ws, resp, err := d.DialContext(ctx, URL(server), h)
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("dial %s: %w (HTTP %s)", URL(server), err, resp.Status)
		}
		return nil, fmt.Errorf("dial %s: %w", URL(server), err)
	}
	ws.SetReadLimit(1 << 30)
	c := &Client{ws: ws, opts: opts, pending: map[uint32]chan protocol.Frame{}, batches: map[uint32]func(BatchItemResult){}, done: make(chan struct{})}
	go c.readLoop()
	return c, nil
}

// Close closes the connection; calls in flight fail with ErrClosed (the
// server still finishes them).
func (c *Client) Close() error {
	c.wmu.Lock()
	c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	c.wmu.Unlock()
	err := c.ws.Close()
	<-c.done
	return err
}

// Done is closed when the connection is gone.
func (c *Client) Done() <-chan struct{} { return c.done }

func (c *Client) readLoop() {
	var err error
	defer func() {
		c.mu.Lock()
		c.err = fmt.Errorf("%w: %v", ErrClosed, err)
		for id, ch := range c.pending {
			close(ch)
			delete(c.pending, id)
		}
		c.mu.Unlock()
		close(c.done)
	}()
	for {
		var b []byte
		_, b, err = c.ws.ReadMessage()
		if err != nil {
			return
		}
		f, ferr := protocol.DecodeFrame(b)
		if ferr != nil {
			continue // not ours to fix; the server never sends these
		}
		switch f.Type {
		case protocol.Response:
			c.mu.Lock()
			ch, ok := c.pending[f.MsgID]
			delete(c.pending, f.MsgID)
			c.mu.Unlock()
			if ok {
				ch <- f
			}
		case protocol.Notification:
			if f.Method == protocol.NotifyStepBatch {
				var it BatchItemResult
				if msgpack.Unmarshal(f.Params, &it) == nil {
					c.mu.Lock()
					fn := c.batches[it.MsgID]
					c.mu.Unlock()
					if fn != nil {
						fn(it)
					}
				}
				continue
			}
			if c.opts.OnNotification != nil {
				c.opts.OnNotification(f.Method, f.Params)
			}
		}
	}
}

// start sends a request and returns the channel its response arrives on.
func (c *Client) start(method string, params any, onItem func(BatchItemResult)) (uint32, chan protocol.Frame, error) {
	ch := make(chan protocol.Frame, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, nil, err
	}
	c.next++
	id := c.next
	c.pending[id] = ch
	if onItem != nil {
		c.batches[id] = onItem
	}
	c.mu.Unlock()
	b, err := protocol.EncodeRequest(id, method, params)
	if err == nil {
		c.wmu.Lock()
		err = c.ws.WriteMessage(websocket.BinaryMessage, b)
		c.wmu.Unlock()
	}
	if err != nil {
		c.forget(id)
		return 0, nil, fmt.Errorf("send %s: %w", method, err)
	}
	return id, ch, nil
}

func (c *Client) forget(id uint32) {
	c.mu.Lock()
	delete(c.pending, id)
	delete(c.batches, id)
	c.mu.Unlock()
}

// get calls method with params and decodes its result into a new R.
func get[R any](ctx context.Context, c *Client, method string, params any) (*R, error) {
	var r R
	return &r, c.Call(ctx, method, params, &r)
}

// Call sends method with params (a struct or map; nil for none) and decodes
// the result into result (nil to drop it). Calls may run concurrently;
// each waits for its own response. When ctx ends first Call returns its
// error; the server still completes the request.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	return c.call(ctx, method, params, result, nil)
}

func (c *Client) call(ctx context.Context, method string, params, result any, onItem func(BatchItemResult)) error {
	retries, budget := c.opts.BusyRetries, c.opts.BusyMaxWait
	if retries == 0 {
		retries = 8
	}
	if budget <= 0 {
		budget = time.Minute
	}
	for try := 0; ; try++ {
		p, err := c.Send(method, params, onItem)
		if err != nil {
			return err
		}
		err = p.Wait(ctx, result)
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeTooManyReqs || pe.RetryAfterMS <= 0 || try >= retries {
			return err
		}
		d := pe.RetryAfter()
		d += rand.N(d/2 + 1)
		if d > budget {
			return err
		}
		budget -= d
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// Pending is a request sent whose answer has not been taken (Send).
type Pending struct {
	c      *Client
	id     uint32
	ch     chan protocol.Frame
	method string
}

// Send sends method with params and returns at once, without waiting
// for the answer: requests sent one after another from one goroutine
// reach the server in that order (what a proxy needs to keep the
// order of operations on an env). onItem, for step_batch, gets each
// item as it finishes. Wait takes the answer.
func (c *Client) Send(method string, params any, onItem func(BatchItemResult)) (*Pending, error) {
	id, ch, err := c.start(method, params, onItem)
	if err != nil {
		return nil, err
	}
	return &Pending{c: c, id: id, ch: ch, method: method}, nil
}

// Wait waits for the answer of a request Send sent and decodes its
// result into result (nil to drop it; a *msgpack.RawMessage keeps it
// undecoded). Errors the server sent are *Error; a connection that
// closed first is ErrClosed. When ctx ends first Wait returns its error
// and the answer is dropped.
func (p *Pending) Wait(ctx context.Context, result any) error {
	c := p.c
	select {
	case f, ok := <-p.ch:
		c.forget(p.id)
		if !ok {
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			return err
		}
		if f.Error != nil {
			return f.Error
		}
		if result != nil {
			if err := msgpack.Unmarshal(f.Result, result); err != nil {
				return fmt.Errorf("decode %s result: %w", p.method, err)
			}
		}
		return nil
	case <-ctx.Done():
		c.forget(p.id)
		return ctx.Err()
	}
}

// Hello checks the protocol version and authenticates with token (the
// Dial token when empty).
func (c *Client) Hello(ctx context.Context, token string) (*HelloResult, error) {
	if token == "" {
		token = c.opts.Token
	}
	var r HelloResult
	if err := c.Call(ctx, protocol.MethodHello, protocol.HelloParams{Token: token}, &r); err != nil {
		return nil, err
	}
	if r.Version != protocol.Version {
		return &r, fmt.Errorf("server speaks protocol v%d, this client v%d", r.Version, protocol.Version)
	}
	return &r, nil
}

// Reset starts an episode of a task or an image.
func (c *Client) Reset(ctx context.Context, p ResetParams) (*ResetResult, error) {
	return get[ResetResult](ctx, c, protocol.MethodReset, p)
}

// Step runs one action in env.
func (c *Client) Step(ctx context.Context, envID string, a Action) (*StepResult, error) {
	return get[StepResult](ctx, c, protocol.MethodStep, protocol.StepParams{EnvID: envID, Action: a})
}

// StepKeyed runs one action in env under a request key: sent again with
// the same key (after a lost answer), it answers the recorded result
// (Info.Replayed) instead of running the action twice (docs/protocol.md,
// "Idempotent steps").
func (c *Client) StepKeyed(ctx context.Context, envID, key string, a Action) (*StepResult, error) {
	return get[StepResult](ctx, c, protocol.MethodStep, protocol.StepParams{EnvID: envID, Action: a, Key: key})
}

// Branch forks an env's current state (p.EnvID) or a state (p.StateID)
// into p.N children.
func (c *Client) Branch(ctx context.Context, p BranchParams) (*BranchResult, error) {
	return get[BranchResult](ctx, c, protocol.MethodBranch, p)
}

// Checkpoint forces a checkpoint of env and returns its state id.
func (c *Client) Checkpoint(ctx context.Context, envID string) (string, error) {
	var r CheckpointResult
	err := c.Call(ctx, protocol.MethodCheckpoint, protocol.EnvParams{EnvID: envID}, &r)
	return r.StateID, err
}

// Rollback returns env to a state.
func (c *Client) Rollback(ctx context.Context, envID, stateID string) (*Info, error) {
	var r RollbackResult
	return &r.Info, c.Call(ctx, protocol.MethodRollback, protocol.RollbackParams{EnvID: envID, StateID: stateID}, &r)
}

// Promote makes a branch's state its origin's and closes the branch.
func (c *Client) Promote(ctx context.Context, envID string) (*PromoteResult, error) {
	return get[PromoteResult](ctx, c, protocol.MethodPromote, protocol.EnvParams{EnvID: envID})
}

// Migrate moves an open env to another node of a cluster (node "": the
// router picks the least loaded); only an arbor router serves it.
func (c *Client) Migrate(ctx context.Context, envID, node string) (*MigrateResult, error) {
	return get[MigrateResult](ctx, c, protocol.MethodMigrate, protocol.MigrateParams{EnvID: envID, Node: node})
}

// Discard throws a branch away.
func (c *Client) Discard(ctx context.Context, envID string) error {
	return c.Call(ctx, protocol.MethodDiscard, protocol.EnvParams{EnvID: envID}, nil)
}

// Evaluate runs the task's verifier on env's current state (the trusted
// grader, docs/tasks.md); env goes on.
func (c *Client) Evaluate(ctx context.Context, envID string) (*Evaluation, error) {
	return get[Evaluation](ctx, c, protocol.MethodEvaluate, protocol.EvaluateParams{EnvID: envID})
}

// Finish evaluates env and closes it: its episode is over (evaluate
// with fork false).
func (c *Client) Finish(ctx context.Context, envID string) (*Evaluation, error) {
	no := false
	return get[Evaluation](ctx, c, protocol.MethodEvaluate, protocol.EvaluateParams{EnvID: envID, Fork: &no})
}

// Tasks pages through the server's tasks, or a dataset's instances.
func (c *Client) Tasks(ctx context.Context, p TasksParams) (*TasksResult, error) {
	return get[TasksResult](ctx, c, protocol.MethodTasks, p)
}

// CloseEnv closes env.
func (c *Client) CloseEnv(ctx context.Context, envID string) error {
	return c.Call(ctx, protocol.MethodClose, protocol.EnvParams{EnvID: envID}, nil)
}

// Envs lists the open envs.
func (c *Client) Envs(ctx context.Context) ([]EnvInfo, error) {
	var r protocol.EnvsResult
	return r.Envs, c.Call(ctx, protocol.MethodEnvs, nil, &r)
}

// States returns the lineage of env's head, root first.
func (c *Client) States(ctx context.Context, envID string) (*StatesResult, error) {
	return get[StatesResult](ctx, c, protocol.MethodStates, protocol.EnvParams{EnvID: envID})
}

// Release drops states the caller will never branch from again: the
// server may delete them as soon as nothing needs them (an open env's
// lineage, a pin, a pending branch). All or none: an unknown id is
// ErrUnknownState.
func (c *Client) Release(ctx context.Context, stateIDs ...string) error {
	return c.Call(ctx, protocol.MethodRelease, protocol.StateIDsParams{StateIDs: stateIDs}, nil)
}

// Pin keeps states (and their ancestors) until Unpin, through their env's
// close and past the server's retention.
func (c *Client) Pin(ctx context.Context, stateIDs ...string) error {
	return c.Call(ctx, protocol.MethodPin, protocol.StateIDsParams{StateIDs: stateIDs}, nil)
}

// Unpin undoes Pin.
func (c *Client) Unpin(ctx context.Context, stateIDs ...string) error {
	return c.Call(ctx, protocol.MethodUnpin, protocol.StateIDsParams{StateIDs: stateIDs}, nil)
}

// Prepare asks the server to restore n frozen copies of each state ahead
// of branches from it (a prefetch hint: a branch from a prepared state
// only thaws them). With wait it answers once they are ready. What did
// not fit in the server's budget is in Refused; when nothing fit, the
// error is ErrOverBudget.
func (c *Client) Prepare(ctx context.Context, stateIDs []string, n int, wait bool) (*PrepareResult, error) {
	return get[PrepareResult](ctx, c, protocol.MethodPrepare, protocol.PrepareParams{StateIDs: stateIDs, N: n, Wait: wait})
}

// StepBatch steps many envs in one request. onItem (may be nil) gets each
// item as it finishes, first finishers first, on the client's read loop;
// the result holds every item in request order.
func (c *Client) StepBatch(ctx context.Context, items []BatchItem, onItem func(BatchItemResult)) (*StepBatchResult, error) {
	var r StepBatchResult
	return &r, c.call(ctx, protocol.MethodStepBatch, protocol.StepBatchParams{Items: items}, &r, onItem)
}
