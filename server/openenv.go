package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/panics"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// The OpenEnv endpoint (docs/openenv.md): every task of the coordinator
// has a base URL /openenv/TASK that OpenEnv's generic client drives, one
// env per websocket at BASE/ws, with JSON text messages {type, data}.
// It is a second adapter over the coordinator beside protocol v1: every
// operation is one of the Server methods the v1 handlers call (reset,
// step, branch, rollback, states, evaluate, closeEnv), under the env's
// ticket, with v1's limits, token and error codes.

// The message types: OpenEnv's (reset, step, state, close) and Arbor's
// extensions in the same style, which a plain OpenEnv client never sends.
const (
	oeReset    = "reset"
	oeStep     = "step"
	oeState    = "state"
	oeClose    = "close"
	oeMCP      = "mcp"
	oeBranch   = "branch"
	oeRollback = "rollback"
	oeStates   = "states"
	oeEvaluate = "evaluate"
	oeDiscard  = "discard"
)

// oeTypes lists the message types, OpenEnv's first (oeOwnTypes of them).
var oeTypes = []string{oeReset, oeStep, oeState, oeClose, oeMCP, oeBranch, oeRollback, oeStates, oeEvaluate, oeDiscard}

const oeOwnTypes = 5

// oeSubmit is the step tool that ends an episode: nothing runs, and the
// reward is the verifier's.
const oeSubmit = "submit"

// openenvRoutes registers the endpoint on mux: served by the coordinator,
// or proxied to the nodes by a Forwarder that is an OpenEnvPlacer (the
// router); a Forwarder that is not serves none.
func (s *Server) openenvRoutes(mux *http.ServeMux) {
	ws := s.serveOpenEnv
	if s.c == nil {
		p, ok := s.o.Forwarder.(OpenEnvPlacer)
		if !ok {
			return
		}
		ws = func(w http.ResponseWriter, r *http.Request) { s.proxyOpenEnv(w, r, p) }
	}
	if s.c != nil {
		s.openenvHTTPRoutes(mux)
	}
	mux.HandleFunc("GET /openenv/{task}/ws", ws)
	// A session's own base URL, so that a plain OpenEnv client (which
	// appends /ws to its base URL) can attach to a branch child.
	mux.HandleFunc("GET /openenv/{task}/session/{session}/ws", ws)
	mux.HandleFunc("GET /openenv/{task}/health", s.openenvHTTP(func(w http.ResponseWriter, _ string) {
		s.mu.Lock()
		draining := s.draining
		s.mu.Unlock()
		if draining {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
	}))
	mux.HandleFunc("GET /openenv/{task}/metadata", s.openenvHTTP(func(w http.ResponseWriter, task string) {
		writeJSON(w, http.StatusOK, map[string]any{
			"name": task, "version": s.o.Version,
			"description": "Arbor task " + task + ": a shell sandbox with checkpoints, branches and rollback; " +
				"the action is a tool call (bash, write_file, read_file, rollback, submit)",
			"readme_content": nil, "author": nil, "documentation_url": nil,
		})
	}))
	mux.HandleFunc("GET /openenv/{task}/schema", s.openenvHTTP(func(w http.ResponseWriter, _ string) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(oeSchema)
	}))
}

// openenvHTTP serves a GET route of a task under the web view's access
// rules (uiAccess): without a token the request must name a loopback host;
// with one it presents it (Bearer or Basic, as the websocket).
func (s *Server) openenvHTTP(h func(w http.ResponseWriter, task string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.secured() && !IsLoopback(r.Host) {
			http.Error(w, "this server answers loopback host names only (or set a token)", http.StatusForbidden)
			return
		}
		if _, ok := s.openenvAuthorized(w, r); !ok {
			return
		}
		task := r.PathValue("task")
		if err := s.hasTask(task); err != nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"detail": err.Error()})
			return
		}
		h(w, task)
	}
}

// hasTask checks that the server (or the nodes behind a Forwarder)
// offers task.
func (s *Server) hasTask(task string) error {
	var names []string
	if s.c != nil {
		names = s.c.TaskNames()
	} else {
		names = s.o.Forwarder.Capabilities().Tasks
	}
	if !slices.Contains(names, task) {
		return fmt.Errorf("no task %q (this server has %s)", task, strings.Join(names, ", "))
	}
	return nil
}

// oeFinisher is an OpenEnv connection, as Shutdown closes it.
type oeFinisher interface{ finish(code int, reason string) }

// oeTrack registers an OpenEnv connection for Shutdown; false (and the
// connection closed) while the server drains. untrack undoes it.
func (s *Server) oeTrack(ws *websocket.Conn, c oeFinisher) bool {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseTryAgainLater, "server shutting down"), time.Now().Add(time.Second))
		ws.Close()
		return false
	}
	if s.oeConns == nil {
		s.oeConns = map[oeFinisher]struct{}{}
	}
	s.oeConns[c] = struct{}{}
	s.mu.Unlock()
	s.m.conns.Inc()
	return true
}

func (s *Server) oeUntrack(c oeFinisher) {
	s.mu.Lock()
	delete(s.oeConns, c)
	s.mu.Unlock()
	s.m.conns.Dec()
}

// oeEncode encodes an answer {"type", "data"} as JSON without HTML
// escaping (command output keeps its < and &).
func oeEncode(typ string, data any) ([]byte, error) {
	return oeJSON(map[string]any{"type": typ, "data": data})
}

// oeJSON encodes v as JSON without HTML escaping.
func oeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), err
}

// openenvAuthorized checks the token of a server that has one, answering
// 401 when it is missing or wrong; it returns the server's context acting
// for the token's tenant and carrying the token (tenant.WithToken).
func (s *Server) openenvAuthorized(w http.ResponseWriter, r *http.Request) (context.Context, bool) {
	// Admission control serves OpenEnv's peers round robin by host: a
	// trainer opens a session (a connection, or HTTP requests) per env.
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ctx := coordinator.WithClient(s.ctx, "openenv "+host)
	if !s.secured() {
		return ctx, true
	}
	if tok, present, ok := headerToken(r, true); present && ok {
		if t, ok := s.authenticate(tok); ok {
			return tenant.WithToken(tenant.With(ctx, t), tok), true
		}
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="arbor"`)
	http.Error(w, "this server needs its token: Authorization: Bearer TOKEN, or the base URL http://arbor:TOKEN@HOST:PORT/openenv/TASK (docs/openenv.md)", http.StatusUnauthorized)
	return nil, false
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// oeSession is an episode the endpoint serves: an env and where its
// episode is. One message at a time is served on it (mu).
type oeSession struct {
	mu        sync.Mutex
	env       string // the env driven, the session id ("" before reset)
	stateID   string
	turn      int
	maxTurns  int
	over      bool // the episode ended (submit, max_turns)
	episodeID string
}

// oeHold is a session the endpoint handed out and who drives it.
type oeHold struct {
	// conn is the websocket driving the session; nil while none does
	// (a branch child nobody attached to yet or any more, a session of
	// the HTTP routes).
	conn *oeConn
	// owned: the env ends with conn (a reset on that websocket made it,
	// as OpenEnv's env lives as long as its connection). Else the
	// session lives until it is closed (discard, POST close) or the
	// server's idle TTL closes its env.
	owned bool
	task  string
	sess  *oeSession
}

// oeSessions are the sessions the endpoint handed out, by env id.
type oeSessions struct {
	mu   sync.Mutex
	held map[string]*oeHold
}

func (o *oeSessions) hold(env string, h *oeHold) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.held == nil {
		o.held = map[string]*oeHold{}
	}
	o.held[env] = h
}

func (o *oeSessions) drop(env string) {
	o.mu.Lock()
	delete(o.held, env)
	o.mu.Unlock()
}

// attach hands a session nobody drives to the websocket c (c nil: to one
// request of the HTTP routes, which leaves it free), if c's tenant sees
// it (another tenant's session is answered as one that does not exist).
func (o *oeSessions) attach(env, task string, c *oeConn, sees func(string) bool) (*oeSession, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	h, ok := o.held[env]
	switch {
	case !ok || !sees(env):
		return nil, oeNoSession(env)
	case h.task != task:
		return nil, state.Errorf(state.ErrInvalid, "session %q runs task %q, not %q: use /openenv/%s", env, h.task, task, h.task)
	case h.conn != nil:
		return nil, state.Errorf(state.ErrInvalid, "session %q is driven by another connection (one connection per session)", env)
	}
	if c != nil {
		h.conn = c
	}
	return h.sess, nil
}

// oeAttach hands session id to the websocket c (nil: to one request of
// the HTTP routes); a session whose env was closed behind the endpoint's
// back (the idle TTL, v1's close) is forgotten and unknown.
func (s *Server) oeAttach(ctx context.Context, id, task string, c *oeConn) (*oeSession, error) {
	if _, err := s.c.Env(id); err != nil {
		s.oe.drop(id)
		return nil, oeNoSession(id)
	}
	return s.oe.attach(id, task, c, func(env string) bool { return s.c.Sees(ctx, env) })
}

// oePrune forgets the sessions nobody drives whose env was closed
// elsewhere (the idle TTL, v1's close): run where sessions without a
// connection are added (branch, the HTTP routes' reset), so that they
// do not pile up. Listing the envs does not count as their use.
func (s *Server) oePrune() {
	// The envs are listed under oe.mu (the coordinator never calls back
	// into the server), so that a session added meanwhile, whose env was
	// made before its hold, is among them.
	s.oe.mu.Lock()
	defer s.oe.mu.Unlock()
	open := map[string]bool{}
	for _, e := range s.c.Envs(tenant.Admin(s.ctx)) {
		open[e.Env.ID] = true
	}
	for id, h := range s.oe.held {
		if h.conn == nil && !open[id] {
			delete(s.oe.held, id)
		}
	}
}

// oeNoSession is the one answer for a session that is not one (never
// was, closed, another tenant's), so that they cannot be told apart.
func oeNoSession(id string) error {
	return state.Errorf(state.ErrUnknownEnv, "no session %q: sessions are the envs this endpoint's reset and branch made, until they are closed", id)
}

// leave ends c's hold on its sessions: the ones it drives but does not
// own are free to attach again; it returns the ones it owns, to close.
func (o *oeSessions) leave(c *oeConn) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ids []string
	for id, h := range o.held {
		if h.conn != c {
			continue
		}
		if h.owned {
			ids = append(ids, id)
		} else {
			h.conn = nil
		}
	}
	return ids
}

// oeConn is one OpenEnv websocket: one session, served one message at a
// time in the order they came, as OpenEnv's server does.
type oeConn struct {
	s    *Server
	ws   *websocket.Conn
	task string
	// ctx is the server's, acting for the connection's tenant.
	ctx  context.Context
	log  *slog.Logger
	done chan struct{} // closed when the connection is gone
	once sync.Once

	// The session driven (never nil: empty before reset); only the
	// goroutine serving messages switches it.
	*oeSession
}

// oeFrame is one message read, or errFrameTooLarge.
type oeFrame struct {
	b   []byte
	err error
}

func (s *Server) serveOpenEnv(w http.ResponseWriter, r *http.Request) {
	actx, ok := s.openenvAuthorized(w, r)
	if !ok {
		return
	}
	task := r.PathValue("task")
	if err := s.hasTask(task); err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	ws, err := s.up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered already
	}
	ws.SetReadLimit(int64(s.o.MaxFrameBytes)*4 + 1024)
	c := &oeConn{s: s, ws: ws, task: task, ctx: actx, done: make(chan struct{}), oeSession: &oeSession{},
		log: s.log.With(slog.String("remote", r.RemoteAddr), slog.String("openenv", task))}
	if !s.oeTrack(ws, c) {
		return
	}
	defer s.oeUntrack(c)
	go c.pings()
	in := make(chan oeFrame)
	go c.readLoop(in)
	id := r.PathValue("session")
	if id == "" {
		id = r.URL.Query().Get("session")
	}
	if id != "" {
		sess, err := s.oeAttach(c.ctx, id, task, c)
		if err != nil {
			c.refuse(in, err)
			return
		}
		c.oeSession = sess
	}
	for f := range in {
		if !c.handle(f) {
			break
		}
	}
	c.closeHeld()
	c.shut(websocket.CloseNormalClosure, "")
}

// refuse answers a refused attach: the error to the first message (an
// OpenEnv client reads an answer only after it sent something), then the
// close (1008) and the client's close in return, so that the error is
// read before the connection ends (a socket closed with the client's
// message unread would reset it, and the answer with it).
func (c *oeConn) refuse(in <-chan oeFrame, err error) {
	if _, ok := <-in; ok {
		c.respond("attach", "", nil, err)
	}
	c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.ClosePolicyViolation, "session refused: "+protocol.ErrorOf(err).Code),
		time.Now().Add(c.s.o.WriteWait))
	t := time.NewTimer(c.s.o.WriteWait)
	defer t.Stop()
	for {
		select {
		case _, ok := <-in:
			if ok {
				continue // after the refusal nothing is served
			}
		case <-t.C:
		}
		c.shut(websocket.ClosePolicyViolation, "session refused")
		return
	}
}

// shut closes the connection once.
func (c *oeConn) shut(code int, reason string) {
	c.once.Do(func() {
		close(c.done)
		c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
		c.ws.Close()
	})
}

// finish is Shutdown's close of the connection.
func (c *oeConn) finish(code int, reason string) { c.shut(code, reason) }

// closeHeld ends the connection's hold on its sessions: the env a reset
// on it made is closed (OpenEnv's env lives as long as its connection);
// a session it attached to (a branch child, a session of the HTTP
// routes) is free to attach again. While the server drains the envs are
// left to the engine's close.
func (c *oeConn) closeHeld() {
	ids := c.s.oe.leave(c)
	if len(ids) == 0 || !c.s.begin() {
		return
	}
	defer c.s.ops.Done()
	for _, id := range ids {
		c.closeEnv(c.ctx, id)
	}
}

// closeEnv closes one env the connection holds, under its ticket.
func (c *oeConn) closeEnv(ctx context.Context, id string) {
	wait, release := c.s.ticket(id)
	wait()
	err := c.s.closeEnv(ctx, id)
	release()
	c.s.oe.drop(id)
	if err != nil && protocol.ErrorOf(err).Code != protocol.CodeUnknownEnv {
		c.log.Warn("close env", slog.String("env", id), slog.Any("err", err))
	}
}

// pings keeps the connection alive as v1's writer does: a ping every
// PingInterval; the read loop drops a client silent for PongWait.
func (c *oeConn) pings() {
	c.s.pingUntil(c.done, []*websocket.Conn{c.ws}, func() { c.shut(websocket.CloseInternalServerErr, "ping failed") })
}

// pingUntil pings every websocket in wss each PingInterval until done
// closes; when a ping fails it calls failed once and stops (the OpenEnv
// connection and its proxy; v1's writer pings in its own loop).
func (s *Server) pingUntil(done <-chan struct{}, wss []*websocket.Conn, failed func()) {
	t := time.NewTicker(s.o.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			dl := time.Now().Add(s.o.WriteWait)
			for _, ws := range wss {
				if ws.WriteControl(websocket.PingMessage, nil, dl) != nil {
					failed()
					return
				}
			}
		}
	}
}

// readLoop reads messages for the serving goroutine until the connection
// ends. Any frame, a pong included, extends the read deadline by PongWait.
func (c *oeConn) readLoop(out chan<- oeFrame) {
	defer close(out)
	alive := func() { c.ws.SetReadDeadline(time.Now().Add(c.s.o.PongWait)) }
	c.ws.SetPongHandler(func(string) error { alive(); return nil })
	// The client's close is answered by shut, after the connection left
	// its sessions (gorilla's default handler would answer it from here,
	// before), so that a client whose close handshake is done can attach
	// to them again at once.
	c.ws.SetCloseHandler(func(int, string) error { return nil })
	for {
		alive()
		_, r, err := c.ws.NextReader()
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				c.log.Info("dropped a silent connection", slog.Duration("pong_wait", c.s.o.PongWait))
			case !websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway) && !errors.Is(err, io.EOF):
				c.log.Debug("read", slog.Any("err", err))
			}
			return
		}
		b, err := readFrame(r, c.s.o.MaxFrameBytes)
		if err != nil && !errors.Is(err, errFrameTooLarge) {
			return // over the hard limit: the connection is dropped
		}
		select {
		case out <- oeFrame{b: b, err: err}:
		case <-c.done:
			return
		}
	}
}

// oeMessage is a message of the client: {"type": ..., "data": ...}.
type oeMessage struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// handle serves one message; false when the connection is to end
// (close).
func (c *oeConn) handle(f oeFrame) bool {
	if f.err != nil {
		c.respond("", "", nil, state.Errorf(state.ErrTooLarge, "message over the %d byte limit", c.s.o.MaxFrameBytes))
		return true
	}
	var m oeMessage
	if err := json.Unmarshal(f.b, &m); err != nil {
		c.respond("", "", nil, state.Errorf(protocol.ErrMalformed, "not a JSON message {\"type\": ..., \"data\": ...}: %v", err))
		return true
	}
	if !slices.Contains(oeTypes, m.Type) {
		c.respond("", "", nil, state.Errorf(protocol.ErrUnknownMethod, "unknown message type %q (OpenEnv's %s; Arbor's %s)",
			m.Type, strings.Join(oeTypes[:oeOwnTypes], ", "), strings.Join(oeTypes[oeOwnTypes:], ", ")))
		return true
	}
	if !c.s.begin() {
		c.respond(m.Type, "", nil, state.Errorf(state.ErrShuttingDown, "server is shutting down"))
		return true
	}
	defer c.s.ops.Done()
	c.s.m.inFlight.Inc()
	defer c.s.m.inFlight.Dec()
	if m.Type == oeClose {
		// OpenEnv's server ends the session without an answer. The
		// connection leaves its sessions before its close goes out, so
		// that once a client's close handshake is done they can be
		// attached again.
		c.closeHeld()
		c.s.m.requests.WithLabelValues("openenv_close", "ok").Inc()
		return false
	}
	data, err := c.serveLocked(m)
	c.respond(m.Type, oeAnswerType(m.Type), data, err)
	return true
}

// oeAnswerType is the type of the answer to a message of type typ.
func oeAnswerType(typ string) string {
	if typ == oeReset || typ == oeStep {
		return "observation"
	}
	return typ
}

// serveLocked serves message m on the connection's session, one message
// at a time (a session of the HTTP routes may be asked concurrently); a
// session whose env is gone (closed by the idle TTL) is forgotten.
func (c *oeConn) serveLocked(m oeMessage) (data any, err error) {
	sess := c.oeSession
	sess.mu.Lock()
	defer sess.mu.Unlock()
	err = panics.Call(c.log, func() (err error) {
		data, err = c.serve(c.ctx, m)
		return err
	}, slog.String("openenv", m.Type))
	if env := sess.env; env != "" && err != nil && protocol.ErrorOf(err).Code == protocol.CodeUnknownEnv {
		c.s.oe.drop(env)
	}
	return data, err
}

// serve serves message m, which is not a close.
func (c *oeConn) serve(ctx context.Context, m oeMessage) (data any, err error) {
	switch m.Type {
	case oeReset:
		data, err = c.reset(ctx, m.Data)
	case oeStep:
		data, err = c.step(ctx, m.Data)
	case oeState:
		data, err = c.state()
	case oeMCP:
		data = c.mcp(ctx, m.Data)
	case oeDiscard:
		data, err = c.discard(ctx)
	case oeBranch:
		data, err = c.branch(ctx, m.Data)
	case oeRollback:
		data, err = c.rollback(ctx, m.Data)
	case oeStates:
		data, err = c.onEnv(func() (any, error) { return c.s.states(ctx, c.env) })
	case oeEvaluate:
		data, err = c.onEnv(func() (any, error) {
			ev, err := c.s.evaluate(ctx, c.env, false)
			if err != nil {
				return nil, err
			}
			return map[string]any{"reward": oeReward(ev.Reward), "details": ev.Details}, nil
		})
	}
	return data, err
}

// respond sends an answer of type typ, or the error: {"type": "error",
// "data": {message, code, retryable, infra}} with v1's codes.
func (c *oeConn) respond(method, typ string, data any, err error) {
	code := "ok"
	if err != nil {
		pe := protocol.ErrorOf(err)
		code, typ = pe.Code, "error"
		ed := oeErrorData(pe)
		var se *oeStepError
		if errors.As(err, &se) {
			ed["state_id"], ed["turn"] = se.stateID, se.turn
		}
		data = ed
		lvl := slog.LevelDebug
		if pe.Infra {
			lvl = slog.LevelWarn
		}
		c.log.Log(context.Background(), lvl, "openenv message failed", slog.String("type", method), slog.String("code", pe.Code), slog.String("err", pe.Message))
	}
	if method == "" || !slices.Contains(oeTypes, method) {
		method = "unknown"
	}
	c.s.m.requests.WithLabelValues("openenv_"+method, code).Inc()
	b, merr := oeEncode(typ, data)
	if merr != nil {
		c.log.Error("encode openenv answer", slog.String("type", method), slog.Any("err", merr))
		b, _ = oeEncode("error", oeErrorData(protocol.ErrorOf(fmt.Errorf("encode answer: %v", merr))))
	}
	c.ws.SetWriteDeadline(time.Now().Add(c.s.o.WriteWait))
	if err := c.ws.WriteMessage(websocket.TextMessage, b); err != nil {
		c.log.Debug("write", slog.Any("err", err))
		c.shut(websocket.CloseInternalServerErr, "write failed")
	}
}

// oeStepError is a failure after a step ran (its verifier at the end of
// the episode): the client learns which state the step made.
type oeStepError struct {
	stateID string
	turn    int
	err     *protocol.Error
}

func (e *oeStepError) Error() string { return e.err.Error() }

// Unwrap makes protocol.ErrorOf see the error's code.
func (e *oeStepError) Unwrap() error { return e.err }

// oeObs is an OpenEnv observation: v1's obs, and its info in metadata.
// Output that is not UTF-8 (JSON strings are text) also comes as base64
// in stdout_b64 / stderr_b64, byte for byte.
type oeObs struct {
	Stdout      string     `json:"stdout"`
	StdoutB64   string     `json:"stdout_b64,omitempty"`
	Stderr      string     `json:"stderr"`
	StderrB64   string     `json:"stderr_b64,omitempty"`
	ExitCode    int        `json:"exit_code"`
	TimedOut    bool       `json:"timed_out"`
	Truncated   bool       `json:"truncated"`
	Cwd         string     `json:"cwd"`
	DurationS   float64    `json:"duration_s"`
	Instruction string     `json:"instruction,omitempty"`
	Metadata    oeMetadata `json:"metadata"`
}

// oeMetadata is v1's info (state_id, turn, checkpoint, ...) and the
// session's.
type oeMetadata struct {
	SessionID string `json:"session_id"`
	protocol.Info
	// MaxTurnsReached is v1's truncated: the episode reached the task's
	// max_turns.
	MaxTurnsReached bool `json:"max_turns_reached"`
	Submitted       bool `json:"submitted,omitempty"`
	// Evaluation is the verifier's details, when the episode ended.
	Evaluation map[string]any `json:"evaluation,omitempty"`
}

// oeResult is the data of an observation answer.
type oeResult struct {
	Observation oeObs     `json:"observation"`
	Reward      *oeReward `json:"reward"`
	Done        bool      `json:"done"`
}

// oeReward is a reward, always written as a JSON float (1.0, not 1), so
// that Python's json gives a float as OpenEnv's StepResult.reward says.
type oeReward float64

// MarshalJSON implements json.Marshaler.
func (r oeReward) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(float64(r))
	if err == nil && !bytes.ContainsAny(b, ".eE") {
		b = append(b, ".0"...)
	}
	return b, err
}

func oeObservation(o protocol.Obs) oeObs {
	out := oeObs{Stdout: string(o.Stdout), Stderr: string(o.Stderr), ExitCode: o.ExitCode, TimedOut: o.TimedOut, Truncated: o.Truncated,
		Cwd: o.Cwd, DurationS: o.DurationS, Instruction: o.Instruction}
	if !utf8.ValidString(out.Stdout) {
		out.StdoutB64 = base64.StdEncoding.EncodeToString([]byte(out.Stdout))
	}
	if !utf8.ValidString(out.Stderr) {
		out.StderrB64 = base64.StdEncoding.EncodeToString([]byte(out.Stderr))
	}
	return out
}

// oeFields decodes a message's data: a JSON object, or none (null,
// absent) when optional.
func oeFields(raw json.RawMessage, required string) (map[string]any, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		if required != "" {
			return nil, state.Errorf(state.ErrInvalidParams, "data: want %s, got nothing", required)
		}
		return map[string]any{}, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, state.Errorf(protocol.ErrMalformed, "data: %v", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		what := required
		if what == "" {
			what = "an object"
		}
		return nil, state.Errorf(state.ErrInvalidParams, "data: want %s, got %s", what, jsonKind(v))
	}
	return m, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "bool"
	case []any:
		return "array"
	case nil:
		return "null"
	}
	return "object"
}

// oeDecode decodes JSON fields into v1 params by v1's rules
// (protocol.DecodeParams: types, ranges, one message naming every bad
// field), so both adapters take and refuse the same requests.
func oeDecode(fields map[string]any, p protocol.Params) error {
	raw, err := msgpack.Marshal(fromJSON(fields))
	if err != nil {
		return state.Errorf(state.ErrInvalidParams, "data: %v", err)
	}
	return protocol.DecodeParams(raw, p)
}

// fromJSON turns decoded JSON numbers into msgpack's integers and floats.
func fromJSON(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = fromJSON(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = fromJSON(e)
		}
		return out
	}
	return v
}

func (c *oeConn) needEnv() error {
	if c.env == "" {
		return state.Errorf(state.ErrInvalid, "no env yet: send reset first")
	}
	return nil
}

// onEnv runs f under the env's ticket.
func (c *oeConn) onEnv(f func() (any, error)) (any, error) {
	if err := c.needEnv(); err != nil {
		return nil, err
	}
	wait, release := c.s.ticket(c.env)
	defer release()
	wait()
	return f()
}

// reset starts an episode of the connection's task, closing the env of
// the last one. data: {seed?, episode_id?}; other fields are ignored, as
// OpenEnv's server ignores what its env's reset does not take.
func (c *oeConn) reset(ctx context.Context, raw json.RawMessage) (any, error) {
	f, err := oeFields(raw, "")
	if err != nil {
		return nil, err
	}
	in := map[string]any{"task": c.task}
	if v, ok := f["seed"]; ok {
		in["seed"] = v
	}
	var p protocol.ResetParams
	if err := oeDecode(in, &p); err != nil {
		return nil, err
	}
	episode, _ := f["episode_id"].(string)
	if v, ok := f["episode_id"]; ok && v != nil && episode == "" {
		return nil, state.Errorf(state.ErrInvalidParams, "episode_id: want a non-empty string, got %s", jsonKind(v))
	}
	if c.env != "" && c.ws != nil {
		// The websocket's last session: closed if this connection made
		// it, else left to attach again.
		for _, id := range c.s.oe.leave(c) {
			c.closeEnv(ctx, id)
		}
		c.oeSession = &oeSession{}
	}
	res, err := c.s.reset(ctx, &p, true)
	if err != nil {
		return nil, err
	}
	sess := &oeSession{env: res.EnvID, stateID: res.Info.StateID, maxTurns: res.Info.MaxTurns, episodeID: episode}
	if sess.episodeID == "" {
		sess.episodeID = res.EnvID
	}
	// Over a websocket the env is the connection's (owned); over HTTP
	// it is a session of its own.
	h := &oeHold{owned: c.ws != nil, task: c.task, sess: sess}
	if c.ws != nil {
		h.conn = c
	}
	if c.ws == nil {
		c.s.oePrune()
	}
	c.s.oe.hold(res.EnvID, h)
	c.oeSession = sess
	obs := oeObservation(res.Obs)
	obs.Metadata = oeMetadata{SessionID: res.EnvID, Info: res.Info}
	return oeResult{Observation: obs}, nil
}

// step runs one action (v1's step, the same function) and, when the
// episode ends (the action submit, or the task's max_turns), the
// verifier: its reward is the answer's. The action is v1's action map,
// with content_b64 for write_file content that is not text.
func (c *oeConn) step(ctx context.Context, raw json.RawMessage) (any, error) {
	f, err := oeFields(raw, "the action, an object {tool, ...}")
	if err != nil {
		return nil, err
	}
	// OpenEnv's MCP actions (MCPToolClient's list_tools, call_tool).
	if t, ok := f["type"]; ok {
		switch t {
		case oeListTools:
			return c.listTools(), nil
		case oeCallTool:
			return c.callTool(ctx, f)
		}
		return nil, state.Errorf(state.ErrInvalidParams, "action.type: want %s or %s (OpenEnv's MCP actions), or no type and a tool", oeListTools, oeCallTool)
	}
	return c.stepAction(ctx, f)
}

// stepAction runs an action of v1's action map (and submit).
func (c *oeConn) stepAction(ctx context.Context, f map[string]any) (oeResult, error) {
	if err := c.needEnv(); err != nil {
		return oeResult{}, err
	}
	if c.over {
		return oeResult{}, state.Errorf(state.ErrInvalid, "the episode is over (turn %d): send reset for a new one, or rollback", c.turn)
	}
	if f["tool"] == oeSubmit {
		wait, release := c.s.ticket(c.env)
		defer release()
		wait()
		obs := oeObs{Metadata: oeMetadata{SessionID: c.env, Submitted: true,
			Info: protocol.Info{StateID: c.stateID, Turn: c.turn, Checkpoint: "none", Tool: oeSubmit, Task: c.task, MaxTurns: c.maxTurns}}}
		return c.end(ctx, obs)
	}
	if b64, ok := f["content_b64"]; ok {
		s, _ := b64.(string)
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return oeResult{}, state.Errorf(state.ErrInvalidParams, "action.content_b64: want base64, %v", err)
		}
		f["content"] = b
		delete(f, "content_b64")
	}
	var p protocol.StepParams
	if err := oeDecode(map[string]any{"env_id": c.env, "action": f}, &p); err != nil {
		return oeResult{}, err
	}
	wait, release := c.s.ticket(c.env)
	defer release()
	wait()
	// The answer's memory, as a v1 step's (answers.go).
	cost := actionCost(p.Action)
	if err := c.s.answers.acquire(ctx, cost); err != nil {
		return oeResult{}, err
	}
	defer c.s.answers.add(-cost)
	res, err := c.s.step(ctx, c.env, p.Action, "")
	if err != nil {
		return oeResult{}, err
	}
	c.stateID, c.turn = res.Info.StateID, res.Info.Turn
	obs := oeObservation(res.Obs)
	obs.Metadata = oeMetadata{SessionID: c.env, Info: res.Info, MaxTurnsReached: res.Truncated}
	if res.Terminated || res.Truncated {
		return c.end(ctx, obs)
	}
	return oeResult{Observation: obs}, nil
}

// end ends the episode with the verifier's reward (none for a task
// without one). A verifier that could not run is an error naming the
// state the step made, never a reward. The caller holds the env's ticket.
func (c *oeConn) end(ctx context.Context, obs oeObs) (oeResult, error) {
	c.over = true
	ev, err := c.s.evaluate(ctx, c.env, false)
	if errors.Is(err, state.ErrNoVerifier) {
		return oeResult{Observation: obs, Done: true}, nil
	}
	if err != nil {
		pe := *protocol.ErrorOf(err)
		pe.Message = fmt.Sprintf("the episode ended at state %s (turn %d) but its reward could not be computed: %s", c.stateID, c.turn, pe.Message)
		return oeResult{}, &oeStepError{stateID: c.stateID, turn: c.turn, err: &pe}
	}
	obs.Metadata.Evaluation = ev.Details
	reward := oeReward(ev.Reward)
	return oeResult{Observation: obs, Reward: &reward, Done: true}, nil
}

// state is OpenEnv's state: episode_id and step_count (the episode's
// turns), and the session's.
func (c *oeConn) state() (any, error) {
	if err := c.needEnv(); err != nil {
		return nil, err
	}
	return map[string]any{"episode_id": c.episodeID, "step_count": c.turn, "session_id": c.env, "state_id": c.stateID,
		"turn": c.turn, "task": c.task, "max_turns": c.maxTurns, "done": c.over}, nil
}

// branch makes n children of the session's env (v1's branch), each a
// session of its own that a connection attaches to at
// BASE/ws?session=ID or, for a plain OpenEnv client, with the base URL
// /openenv/TASK/session/ID (or the HTTP routes with its session_id). A
// child outlives the connection that made it and those that drove it:
// it lives until discarded or closed by the server's idle TTL. data: {n}.
func (c *oeConn) branch(ctx context.Context, raw json.RawMessage) (any, error) {
	if err := c.needEnv(); err != nil {
		return nil, err
	}
	f, err := oeFields(raw, "an object {n}")
	if err != nil {
		return nil, err
	}
	f["env_id"] = c.env
	delete(f, "state_id")
	var p protocol.BranchParams
	if err := oeDecode(f, &p); err != nil {
		return nil, err
	}
	res, err := c.onEnv(func() (any, error) { return c.s.branch(ctx, &p) })
	if err != nil {
		return nil, err
	}
	br := res.(*protocol.BranchResult)
	c.s.oePrune()
	paths := make([]string, len(br.EnvIDs))
	for i, id := range br.EnvIDs {
		if id != "" {
			c.s.oe.hold(id, &oeHold{task: c.task, sess: &oeSession{env: id, stateID: br.StateID, turn: br.Turn, maxTurns: c.maxTurns, episodeID: id}})
			paths[i] = "/openenv/" + c.task + "/session/" + id
		}
	}
	return map[string]any{"sessions": br.EnvIDs, "base_paths": paths, "state_id": br.StateID, "turn": br.Turn, "errors": br.Errors, "took_s": br.TookS}, nil
}

// rollback restores the session's env at a state (v1's rollback method:
// any state the server knows) and reopens an episode that was over.
// data: {state_id}.
func (c *oeConn) rollback(ctx context.Context, raw json.RawMessage) (any, error) {
	if err := c.needEnv(); err != nil {
		return nil, err
	}
	f, err := oeFields(raw, "an object {state_id}")
	if err != nil {
		return nil, err
	}
	f["env_id"] = c.env
	var p protocol.RollbackParams
	if err := oeDecode(f, &p); err != nil {
		return nil, err
	}
	res, err := c.onEnv(func() (any, error) { return c.s.rollback(ctx, c.env, p.StateID) })
	if err != nil {
		return nil, err
	}
	info := res.(*protocol.RollbackResult).Info
	c.stateID, c.turn, c.over = info.StateID, info.Turn, false
	return map[string]any{"session_id": c.env, "state_id": info.StateID, "turn": info.Turn, "restored": info.Restored}, nil
}

// oeSchema is what /schema answers: JSON schemas of the action, the
// observation and the state.
var oeSchema = func() []byte {
	str := map[string]any{"type": "string"}
	num := map[string]any{"type": "number"}
	integer := map[string]any{"type": "integer"}
	boolean := map[string]any{"type": "boolean"}
	actions := make([]any, len(oeToolDefs))
	for i, d := range oeToolDefs {
		actions[i] = d.schema(true)
	}
	b, err := json.Marshal(map[string]any{
		"action": map[string]any{"title": "ArborAction", "oneOf": actions},
		"observation": map[string]any{"title": "ArborObservation", "type": "object", "properties": map[string]any{
			"stdout": str, "stdout_b64": str, "stderr": str, "stderr_b64": str, "exit_code": integer, "timed_out": boolean,
			"truncated": boolean, "cwd": str, "duration_s": num, "instruction": str,
			"metadata": map[string]any{"type": "object", "properties": map[string]any{
				"session_id": str, "state_id": str, "turn": integer, "checkpoint": str, "tool": str, "task": str, "max_turns": integer,
				"max_turns_reached": boolean, "submitted": boolean, "evaluation": map[string]any{"type": "object"},
			}},
		}},
		"state": map[string]any{"title": "ArborState", "type": "object", "properties": map[string]any{
			"episode_id": str, "step_count": integer, "session_id": str, "state_id": str, "turn": integer, "task": str,
			"max_turns": integer, "done": boolean,
		}},
	})
	if err != nil {
		panic(err)
	}
	return b
}()
