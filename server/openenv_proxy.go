package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// OpenEnvPlacer is what a Forwarder implements for its server to serve
// the OpenEnv endpoint (docs/openenv.md) by proxy: an OpenEnv connection
// holds its env for its whole life, so it is placed once, on one node,
// and its frames go to that node's own endpoint.
type OpenEnvPlacer interface {
	// OpenEnvNode names the host:port of the arbor serve a connection of
	// task goes to, and the token to present there ("" for none): for
	// session "", a node that offers task (the connection's resets make
	// their envs there), else the node that holds that env. done is
	// called when the connection ends.
	OpenEnvNode(ctx context.Context, task, session string) (addr, token string, done func(), err error)
}

// oeProxy is one OpenEnv connection proxied to a node's endpoint.
type oeProxy struct {
	s            *Server
	client, node *websocket.Conn
	log          *slog.Logger
	wmu          sync.Mutex // writes of data frames to the client
	done         chan struct{}
	once         sync.Once
}

func (s *Server) proxyOpenEnv(w http.ResponseWriter, r *http.Request, p OpenEnvPlacer) {
	actx, ok := s.openenvAuthorized(w, r)
	if !ok {
		return
	}
	task := r.PathValue("task")
	if err := s.hasTask(task); err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	session := r.PathValue("session")
	if session == "" {
		session = r.URL.Query().Get("session")
	}
	ws, err := s.up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(int64(s.o.MaxFrameBytes)*4 + 1024)
	x := &oeProxy{s: s, client: ws, done: make(chan struct{}),
		log: s.log.With(slog.String("remote", r.RemoteAddr), slog.String("openenv", task))}
	if !s.oeTrack(ws, x) {
		return
	}
	defer s.oeUntrack(x)
	ctx, cancel := context.WithTimeout(actx, 10*time.Second)
	addr, token, done, err := p.OpenEnvNode(ctx, task, session)
	if err == nil {
		defer done()
		x.node, err = dialNode(ctx, addr, token, task, session)
	}
	cancel()
	if err != nil {
		x.fail(err)
		return
	}
	go x.pings()
	go x.fromNode()
	x.fromClient()
	x.shut(websocket.CloseNormalClosure, "")
}

// dialNode opens the node's endpoint for a connection.
func dialNode(ctx context.Context, addr, token, task, session string) (*websocket.Conn, error) {
	u := "ws://" + addr + "/openenv/" + url.PathEscape(task) + "/ws"
	if session != "" {
		u += "?session=" + url.QueryEscape(session)
	}
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	ws, resp, err := websocket.DefaultDialer.DialContext(ctx, u, h)
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, state.Errorf(state.ErrUnknownTask, "the node at %s has no task %q", addr, task)
		}
		return nil, state.Errorf(protocol.ErrNodeUnavailable, "node %s is unavailable: %v", addr, err)
	}
	return ws, nil
}

func (x *oeProxy) finish(code int, reason string) { x.shut(code, reason) }

// shut closes both connections once.
func (x *oeProxy) shut(code int, reason string) {
	x.once.Do(func() {
		close(x.done)
		x.client.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
		x.client.Close()
		if x.node != nil {
			x.node.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			x.node.Close()
		}
	})
}

// fail answers err as an error message and closes the connection.
func (x *oeProxy) fail(err error) {
	pe := protocol.ErrorOf(err)
	x.s.m.requests.WithLabelValues("openenv_unknown", pe.Code).Inc()
	x.log.Warn("openenv proxy", slog.String("code", pe.Code), slog.String("err", pe.Message))
	x.write(websocket.TextMessage, mustEncodeError(pe))
	x.shut(websocket.CloseNormalClosure, "")
}

func mustEncodeError(err error) []byte {
	b, _ := oeEncode("error", oeErrorData(protocol.ErrorOf(err)))
	return b
}

// write sends a frame to the client.
func (x *oeProxy) write(mt int, b []byte) bool {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	x.client.SetWriteDeadline(time.Now().Add(x.s.o.WriteWait))
	if err := x.client.WriteMessage(mt, b); err != nil {
		x.shut(websocket.CloseInternalServerErr, "write failed")
		return false
	}
	return true
}

// pings keeps both ends alive as the server's own connections do.
func (x *oeProxy) pings() {
	x.s.pingUntil(x.done, []*websocket.Conn{x.client, x.node}, func() { x.shut(websocket.CloseInternalServerErr, "ping failed") })
}

// fromClient sends the client's messages to the node, refusing those
// over MaxFrameBytes itself (too_large), until the client goes.
func (x *oeProxy) fromClient() {
	alive := func() { x.client.SetReadDeadline(time.Now().Add(x.s.o.PongWait)) }
	x.client.SetPongHandler(func(string) error { alive(); return nil })
	for {
		alive()
		mt, r, err := x.client.NextReader()
		if err != nil {
			return
		}
		b, err := readFrame(r, x.s.o.MaxFrameBytes)
		if errors.Is(err, errFrameTooLarge) {
			x.s.m.requests.WithLabelValues("openenv_unknown", protocol.CodeTooLarge).Inc()
			if !x.write(websocket.TextMessage, mustEncodeError(state.Errorf(state.ErrTooLarge, "message over the %d byte limit", x.s.o.MaxFrameBytes))) {
				return
			}
			continue
		}
		if err != nil {
			return
		}
		x.node.SetWriteDeadline(time.Now().Add(x.s.o.WriteWait))
		if err := x.node.WriteMessage(mt, b); err != nil {
			x.nodeLost(err)
			return
		}
	}
}

// fromNode sends the node's answers to the client. The node closing the
// connection (after a close message, a refused attach, its shutdown)
// closes the client's with the same code; any other end is the node's
// failure, answered node_unavailable.
func (x *oeProxy) fromNode() {
	alive := func() { x.node.SetReadDeadline(time.Now().Add(x.s.o.PongWait)) }
	x.node.SetPongHandler(func(string) error { alive(); return nil })
	for {
		alive()
		mt, r, err := x.node.NextReader()
		if err != nil {
			// (gorilla reports a connection cut without a close frame as
			// a CloseError of code 1006: that is a failure.)
			var ce *websocket.CloseError
			if errors.As(err, &ce) && ce.Code != websocket.CloseAbnormalClosure {
				x.shut(ce.Code, ce.Text)
			} else {
				x.nodeLost(err)
			}
			return
		}
		b, err := io.ReadAll(r)
		if err != nil {
			x.nodeLost(err)
			return
		}
		if !x.write(mt, b) {
			return
		}
	}
}

// nodeLost tells the client that its node's connection failed, unless
// the connection is ending anyway.
func (x *oeProxy) nodeLost(err error) {
	select {
	case <-x.done:
		return
	default:
	}
	var ne net.Error
	why := err.Error()
	if errors.As(err, &ne) && ne.Timeout() {
		why = "it stopped answering"
	}
	x.fail(state.Errorf(protocol.ErrNodeUnavailable, "the connection to the env's node dropped (%s): the message in flight may or may not have run there", why))
}
