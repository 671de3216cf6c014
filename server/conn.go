package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/panics"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// conn is one websocket connection.
type conn struct {
	s       *Server
	ws      *websocket.Conn
	log     *slog.Logger
	ob      *outbox       // frames for the writer, counted against MaxUnreadBytes
	done    chan struct{} // closed when the connection is gone
	closing chan struct{} // closed to make the writer flush and close
	flushed chan struct{} // closed when the writer has ended
	finOnce sync.Once
	once    sync.Once
	authed  atomic.Bool
	// who is whom the connection's requests act for, set before authed.
	who      atomic.Pointer[who]
	inFlight atomic.Int64
	idsMu    sync.Mutex
	ids      map[uint32]bool // msgids of the requests in flight
	// paused: the read loop waits for the client to read; gated: requests
	// read but not started for the same reason (export_test.go).
	paused atomic.Bool
	gated  atomic.Int64
	// client names the connection to admission control, which serves
	// the connections of a tenant round robin (coordinator.WithClient).
	client string
}

// claim records msgid as in flight; false when it already is (a client
// that reused an id could not tell the two answers apart).
func (c *conn) claim(msgid uint32) bool {
	c.idsMu.Lock()
	defer c.idsMu.Unlock()
	if c.ids[msgid] {
		return false
	}
	if c.ids == nil {
		c.ids = map[uint32]bool{}
	}
	c.ids[msgid] = true
	return true
}

// unclaim frees msgid for reuse; it runs before the request's answer is
// sent, so a client may reuse the id as soon as it has the answer.
func (c *conn) unclaim(msgid uint32) {
	c.idsMu.Lock()
	delete(c.ids, msgid)
	c.idsMu.Unlock()
}

func (s *Server) serveWS(w http.ResponseWriter, r *http.Request) {
	authed := !s.secured()
	var id who
	if tok, present, ok := headerToken(r, false); present {
		if ok {
			id.t, ok = s.authenticate(tok)
			id.token = tok
		}
		if !ok {
			http.Error(w, "bad bearer token", http.StatusUnauthorized)
			return
		}
		authed = true
	}
	ws, err := s.up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered already
	}
	// Frames up to 4x the limit are read (and discarded) so that their
	// sender gets a too_large error; anything bigger drops the connection.
	ws.SetReadLimit(int64(s.o.MaxFrameBytes)*4 + 1024)
	c := &conn{s: s, ws: ws, done: make(chan struct{}),
		closing: make(chan struct{}), flushed: make(chan struct{}),
		log: s.log.With(slog.String("remote", r.RemoteAddr))}
	c.client = fmt.Sprintf("v1 %s %p", r.RemoteAddr, c)
	c.ob = newOutbox(int64(s.o.MaxUnreadBytes), func(d int64) { s.m.unread.Add(float64(d)); s.answers.add(d) }, c.deadline)
	c.who.Store(&id)
	c.authed.Store(authed)
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseTryAgainLater, "server shutting down"), time.Now().Add(time.Second))
		ws.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	s.m.conns.Inc()
	c.log.Debug("connected")
	go c.writeLoop()
	c.readLoop()
	c.shut(websocket.CloseNormalClosure, "")
	<-c.flushed // the writer ends on shut (a write it is in fails on the closed socket)
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.m.conns.Dec()
	c.log.Debug("disconnected")
}

// headerToken reads the token of a request's Authorization header:
// "Bearer TOKEN", and with basic also "Basic base64(USER:TOKEN)" (any
// user), which websocket clients send for a URL ws://USER:TOKEN@HOST/...
// (the OpenEnv client's only way to present one). present is false
// without the header; ok is false for a header of another form.
func headerToken(r *http.Request, basic bool) (tok string, present, ok bool) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", false, false
	}
	if tok, ok := strings.CutPrefix(h, "Bearer "); ok {
		return tok, true, true
	}
	if _, pass, ok := r.BasicAuth(); ok && basic {
		return pass, true, true
	}
	return "", true, false
}

// errFrameTooLarge: a frame over the connection's MaxFrameBytes, read
// and discarded.
var errFrameTooLarge = errors.New("frame too large")

// readFrame reads one message of at most max bytes. A larger one is read
// to its end and discarded (errFrameTooLarge), so that its sender can be
// told; one over the websocket's read limit (4x max) fails the read, and
// the connection is dropped.
func readFrame(r io.Reader, max int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > max {
		if _, err := io.Copy(io.Discard, r); err != nil {
			return nil, err
		}
		return b[:max], errFrameTooLarge
	}
	return b, nil
}

// shut closes the connection once; operations it started go on, and their
// answers are dropped.
func (c *conn) shut(code int, reason string) {
	c.once.Do(func() {
		close(c.done)
		c.ob.close()
		c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
		c.ws.Close()
	})
}

// finish makes the writer send every queued frame, then close the
// connection with code; it waits up to wait for that.
func (c *conn) finish(code int, reason string, wait time.Duration) {
	c.finOnce.Do(func() { close(c.closing) })
	select {
	case <-c.flushed:
	case <-time.After(wait):
	}
	c.shut(code, reason)
}

func (c *conn) writeLoop() {
	defer close(c.flushed)
	// Pings make a live client answer within PongWait (readLoop's
	// deadline); a half-open one, gone without a close, is dropped then.
	ping := time.NewTicker(c.s.o.PingInterval)
	defer ping.Stop()
	// A frame write that takes longer than WriteWait drops the client:
	// that is what ends a connection whose client stopped reading, once
	// its answers fill the socket (docs/protocol.md, "Limits").
	wait := c.s.o.WriteWait
	write := func(b []byte) bool {
		c.ws.SetWriteDeadline(time.Now().Add(wait))
		if err := c.ws.WriteMessage(websocket.BinaryMessage, b); err != nil {
			c.log.Debug("write", slog.Any("err", err))
			c.shut(websocket.CloseInternalServerErr, "write failed")
			return false
		}
		c.ob.wrote(len(b))
		return true
	}
	for {
		select {
		case <-c.done:
			return
		case <-c.ob.ready:
			if b := c.ob.take(); b != nil && !write(b) {
				return
			}
		case <-ping.C:
			if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(wait)); err != nil {
				c.log.Debug("ping", slog.Any("err", err))
				c.shut(websocket.CloseInternalServerErr, "ping failed")
				return
			}
		case <-c.closing:
			for b := c.ob.take(); b != nil; b = c.ob.take() {
				if !write(b) {
					return
				}
			}
			return
		}
	}
}

// send queues a frame for the writer; it never blocks (the budget of
// unread bytes is enforced where requests are read and started) and drops
// the frame when the connection is gone.
func (c *conn) send(b []byte) { c.ob.put(b) }

// deadline arms the read deadline: PongWait from now while the client
// has read its answers (under MaxUnreadBytes), none while it has not. A
// connection over budget reads nothing (so it would see no pong) and is
// watched by the writer's deadline instead: its writer has frames to
// write, and a client that takes none for WriteWait is dropped. It runs
// with the outbox's lock held (outbox.over, onCross), so a pong's
// deadline cannot undo a crossing of the budget.
func (c *conn) deadline(over bool) {
	var t time.Time
	if !over {
		t = time.Now().Add(c.s.o.PongWait)
	}
	c.ws.SetReadDeadline(t)
}

// room waits until the connection's unread answers are under budget (or
// the connection is gone); false when the server gave up on operations.
func (c *conn) room(ctx context.Context) bool {
	ch := c.ob.full()
	if ch == nil {
		return true
	}
	c.gated.Add(1)
	defer c.gated.Add(-1)
	select {
	case <-ch:
	case <-c.done:
	case <-ctx.Done():
		return false
	}
	return true
}

func (c *conn) respond(msgid uint32, method string, result any, err error) {
	var pe *protocol.Error
	code := "ok"
	if err != nil {
		pe = protocol.ErrorOf(err)
		code = pe.Code
		lvl := slog.LevelDebug
		if pe.Infra {
			lvl = slog.LevelWarn
		}
		c.log.Log(context.Background(), lvl, "request failed", slog.String("method", method), slog.Uint64("msgid", uint64(msgid)),
			slog.String("code", pe.Code), slog.String("err", pe.Message))
	}
	if !knownMethod(method) {
		method = "unknown"
	}
	c.s.m.requests.WithLabelValues(method, code).Inc()
	b, merr := protocol.EncodeResponse(msgid, pe, result)
	if merr != nil {
		c.log.Error("encode response", slog.String("method", method), slog.Any("err", merr))
		b, _ = protocol.EncodeResponse(msgid, protocol.ErrorOf(fmt.Errorf("encode response: %v", merr)), nil)
	}
	c.send(b)
}

func (c *conn) notify(method string, params any) {
	b, err := protocol.EncodeNotification(method, params)
	if err != nil {
		c.log.Error("encode notification", slog.String("method", method), slog.Any("err", err))
		return
	}
	c.send(b)
}

func knownMethod(m string) bool {
	_, ok := handlers[m]
	return ok
}

// readLoop reads frames until the connection ends. Any frame from the
// client, a pong included, proves it is still there and extends the read
// deadline by PongWait; a client silent for longer is dropped. While the
// client has more than MaxUnreadBytes of answers unread, the loop reads
// nothing (backpressure: the client's writes block) and no deadline runs
// (see deadline).
func (c *conn) readLoop() {
	max := c.s.o.MaxFrameBytes
	alive := func() { c.ob.over(c.deadline) }
	alive()
	c.ws.SetPongHandler(func(string) error {
		alive()
		return nil
	})
	for {
		if ch := c.ob.full(); ch != nil {
			c.paused.Store(true)
			c.log.Debug("client is not reading: stop reading its requests", slog.Int("max_unread_bytes", c.s.o.MaxUnreadBytes))
			select {
			case <-ch:
			case <-c.done:
			}
			c.paused.Store(false)
		}
		mt, r, err := c.ws.NextReader()
		if err == nil {
			alive()
		}
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
		b, err := readFrame(r, max)
		if err != nil && !errors.Is(err, errFrameTooLarge) {
			return // over the hard limit: the connection is dropped
		}
		if err != nil {
			c.refuse(b, state.Errorf(state.ErrTooLarge, "frame over the %d byte limit", max))
			continue
		}
		if mt != websocket.BinaryMessage {
			c.notify(protocol.NotifyError, protocol.ErrorOf(state.Errorf(protocol.ErrMalformed, "text frame: send one msgpack message per binary frame")))
			continue
		}
		// dispatch recovers a panic of a request it started; this one is
		// of the decoding before.
		if err := panics.Call(c.log, func() error { c.dispatch(b); return nil }); err != nil {
			c.notify(protocol.NotifyError, protocol.ErrorOf(fmt.Errorf("%v", err)))
		}
	}
}

// refuse answers frame b with e: as the response to its request when the
// frame names one, else as an error notification.
func (c *conn) refuse(b []byte, e error) {
	if id, method, ok := protocol.PeekRequest(b); ok {
		c.respond(id, method, nil, e)
	} else {
		c.notify(protocol.NotifyError, protocol.ErrorOf(e))
	}
}

// dispatch decodes one frame and starts its request. It runs on the read
// loop, so tickets are taken in the order frames arrived.
func (c *conn) dispatch(b []byte) {
	f, err := protocol.DecodeFrame(b)
	if err != nil {
		c.refuse(b, state.Errorf(protocol.ErrMalformed, "%v", err))
		return
	}
	if f.Type != protocol.Request {
		c.notify(protocol.NotifyError, protocol.ErrorOf(state.Errorf(protocol.ErrMalformed, "message type %d: clients send requests (type 0) only", f.Type)))
		return
	}
	h, ok := handlers[f.Method]
	if !ok {
		c.respond(f.MsgID, f.Method, nil, state.Errorf(protocol.ErrUnknownMethod, "unknown method %q (protocol v%d has %s)",
			f.Method, protocol.Version, strings.Join(protocol.Methods, ", ")))
		return
	}
	if !c.authed.Load() && f.Method != protocol.MethodHello {
		c.respond(f.MsgID, f.Method, nil, state.Errorf(protocol.ErrUnauthorized, "this server needs a token: send hello {token} first or an Authorization: Bearer header"))
		return
	}
	if !c.claim(f.MsgID) {
		c.respond(f.MsgID, f.Method, nil, state.Errorf(state.ErrInvalid, "msgid %d is already in flight on this connection: give every pending request an id of its own", f.MsgID))
		return
	}
	if n := c.inFlight.Add(1); n > int64(c.s.o.MaxInFlight) {
		c.inFlight.Add(-1)
		c.unclaim(f.MsgID)
		c.respond(f.MsgID, f.Method, nil, state.Errorf(state.ErrBusy, "%d requests in flight on this connection, the limit is %d", n-1, c.s.o.MaxInFlight))
		return
	}
	if !c.s.begin() {
		c.inFlight.Add(-1)
		c.unclaim(f.MsgID)
		c.respond(f.MsgID, f.Method, nil, state.Errorf(state.ErrShuttingDown, "server is shutting down"))
		return
	}
	req := &request{c: c, msgid: f.MsgID, method: f.Method}
	// A panic in parse or Forward fails this request alone (req.err),
	// which then takes no ticket.
	var envs []string
	if err := panics.Call(c.log, func() error {
		if fw := c.s.o.Forwarder; fw != nil && f.Method != protocol.MethodHello {
			req.serve = fw.Forward(c.ctx(), f.MsgID, f.Method, f.Params, c.notify)
		} else {
			envs = h.parse(c.s, req, f.Params)
		}
		return nil
	}, slog.String("method", f.Method), slog.Uint64("msgid", uint64(f.MsgID))); err != nil {
		req.err, envs = err, nil
	}
	req.wait, req.release = c.s.ticket(envs...)
	c.s.m.inFlight.Inc()
	go func() {
		defer c.s.ops.Done()
		defer c.inFlight.Add(-1)
		defer c.s.m.inFlight.Dec()
		released := false
		release := func() {
			if !released {
				released = true
				req.release()
			}
		}
		// The answer is queued before the env's next operation may start,
		// so that operation's room check counts it.
		defer release()
		result, err := c.run(h, req, release)
		c.unclaim(f.MsgID)
		c.respond(f.MsgID, f.Method, result, err)
		c.s.answers.add(-req.reserved)
	}()
}

// run serves one request under its env tickets. It starts the request
// only while the connection's unread answers are under budget: requests
// pipelined behind the ones that filled it wait for the client to read.
func (c *conn) run(h handler, req *request, release func()) (result any, err error) {
	s := c.s
	defer panics.Recover(c.log, &err, slog.String("method", req.method), slog.Uint64("msgid", uint64(req.msgid)))
	if req.err != nil {
		req.wait()
		return nil, req.err
	}
	if h.self {
		// The handler takes and releases its own tickets (step_batch).
		release()
	} else {
		req.wait()
	}
	if !c.room(s.ctx) {
		return nil, state.Errorf(state.ErrShuttingDown, "server is shutting down")
	}
	// The most this answer can take is reserved while it runs; its frame,
	// once queued, counts instead (answerBudget).
	if err := s.answers.acquire(s.ctx, req.cost); err != nil {
		return nil, err
	}
	req.reserved = req.cost // given back once the answer is queued
	return req.serve(c.ctx())
}

// who is a connection's tenant and the token that named it.
type who struct {
	t     tenant.Tenant
	token string
}

// ctx is the server's context acting for the connection's tenant and
// carrying its token (tenant.WithToken, for a forwarding server).
func (c *conn) ctx() context.Context {
	id := c.who.Load()
	return coordinator.WithClient(tenant.WithToken(tenant.With(c.s.ctx, id.t), id.token), c.client)
}
