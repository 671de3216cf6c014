package server

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"

	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// The HTTP routes of the OpenEnv endpoint: POST reset, POST step, GET
// state (OpenEnv's HTTP server's) and POST close (Arbor's), with the
// websocket messages' semantics. OpenEnv's own HTTP routes are stateless
// (a fresh env per request); a shell episode needs its session, so here
// reset makes a session and answers its id (metadata.session_id), which
// step, state and close name (session_id in the body, or the query). A
// session lives until close or the server's idle TTL, like a branch
// child, and a websocket can attach to it (ws?session=ID).

// openenvHTTPRoutes registers the HTTP routes on mux (a server with a
// coordinator only: the router forwards websockets).
func (s *Server) openenvHTTPRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /openenv/{task}/reset", s.openenvPost(oeReset))
	mux.HandleFunc("POST /openenv/{task}/step", s.openenvPost(oeStep))
	mux.HandleFunc("GET /openenv/{task}/state", s.openenvPost(oeState))
	mux.HandleFunc("POST /openenv/{task}/close", s.openenvPost(oeClose))
	mux.HandleFunc("POST /openenv/{task}/mcp", s.openenvPost(oeMCP))
}

// mcpHTTP answers OpenEnv's POST /mcp (MCPToolClient's production mode):
// a JSON-RPC request, always answered 200 with a JSON-RPC response.
// openenv/session/create makes a session (the HTTP routes' reset) and
// answers {session_id}; tools/list needs none; tools/call runs on the
// session params.session_id names (a turn, as the "mcp" message);
// openenv/session/close closes it.
func (c *oeConn) mcpHTTP(raw []byte) any {
	var req rpcRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return rpcError(nil, rpcParseError, "parse error: "+err.Error(), nil)
	}
	var p struct {
		SessionID string `json:"session_id"`
	}
	json.Unmarshal(req.Params, &p)
	fail := func(err error) any {
		pe := protocol.ErrorOf(err)
		return rpcError(req.ID, oeCodeOf(pe).rpc, pe.Message, oeErrorData(pe))
	}
	switch req.Method {
	case "openenv/session/create":
		data, err := c.serveLocked(oeMessage{Type: oeReset})
		if err != nil {
			return fail(err)
		}
		res, _ := data.(oeResult)
		return rpcResult(req.ID, map[string]any{"session_id": res.Observation.Metadata.SessionID})
	case "tools/call", "openenv/session/close":
		if p.SessionID == "" {
			return rpcError(req.ID, rpcInvalidParams, "params.session_id: required (openenv/session/create makes one)", nil)
		}
		sess, err := c.s.oeAttach(c.ctx, p.SessionID, c.task, nil)
		if err != nil {
			return fail(err)
		}
		c.oeSession = sess
		if req.Method == "tools/call" {
			data, err := c.serveLocked(oeMessage{Type: oeMCP, Data: raw})
			if err != nil {
				return fail(err) // a panic; the mcp answer has its errors inside
			}
			return data
		}
		if _, err := c.serveLocked(oeMessage{Type: oeDiscard}); err != nil {
			return fail(err)
		}
		return rpcResult(req.ID, map[string]any{"session_id": p.SessionID, "closed": true})
	}
	return c.mcp(c.ctx, raw)
}

// oeHTTPBody is the body of a request: OpenEnv's ResetRequest {seed?,
// episode_id?} or StepRequest {action, timeout_s?, request_id?}, and the
// session (extra fields, which OpenEnv's requests allow).
type oeHTTPBody struct {
	SessionID string          `json:"session_id"`
	Action    json.RawMessage `json:"action"`
}

// openenvPost serves the HTTP route of message type typ.
func (s *Server) openenvPost(typ string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.secured() && !IsLoopback(r.Host) {
			http.Error(w, "this server answers loopback host names only (or set a token)", http.StatusForbidden)
			return
		}
		actx, ok := s.openenvAuthorized(w, r)
		if !ok {
			return
		}
		task := r.PathValue("task")
		c := &oeConn{s: s, task: task, ctx: actx, oeSession: &oeSession{},
			log: s.log.With(slog.String("remote", r.RemoteAddr), slog.String("openenv", task), slog.String("via", "http"))}
		data, err := c.serveHTTP(typ, r)
		if err != nil {
			pe := protocol.ErrorOf(err)
			c.s.m.requests.WithLabelValues("openenv_http_"+typ, pe.Code).Inc()
			ed := oeErrorData(pe)
			ed["detail"] = pe.Message // FastAPI's error field
			setRetryAfter(w, pe)
			writeJSON(w, oeCodeOf(pe).http, ed)
			return
		}
		c.s.m.requests.WithLabelValues("openenv_http_"+typ, "ok").Inc()
		b, err := oeJSON(data)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, oeErrorData(protocol.ErrorOf(err)))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	}
}

// serveHTTP serves one request as the message typ on the session it
// names (a new one for reset).
func (c *oeConn) serveHTTP(typ string, r *http.Request) (any, error) {
	if err := c.s.hasTask(c.task); err != nil {
		return nil, state.Errorf(state.ErrUnknownTask, "%v", err)
	}
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, int64(c.s.o.MaxFrameBytes)))
	if err != nil {
		return nil, state.Errorf(state.ErrTooLarge, "request body over the %d byte limit", c.s.o.MaxFrameBytes)
	}
	if !c.s.begin() {
		return nil, state.Errorf(state.ErrShuttingDown, "server is shutting down")
	}
	defer c.s.ops.Done()
	c.s.m.inFlight.Inc()
	defer c.s.m.inFlight.Dec()
	if typ == oeMCP {
		return c.mcpHTTP(raw), nil
	}
	var body oeHTTPBody
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &body); err != nil {
			return nil, state.Errorf(protocol.ErrMalformed, "body: want a JSON object: %v", err)
		}
	}
	if body.SessionID == "" {
		body.SessionID = r.URL.Query().Get("session_id")
	}
	if typ == oeReset {
		return c.serveLocked(oeMessage{Type: oeReset, Data: raw})
	}
	if body.SessionID == "" {
		return nil, state.Errorf(state.ErrInvalidParams, "session_id: required (the metadata.session_id of reset's answer), in the body or the query")
	}
	sess, err := c.s.oeAttach(c.ctx, body.SessionID, c.task, nil)
	if err != nil {
		return nil, err
	}
	c.oeSession = sess
	switch typ {
	case oeStep:
		if len(bytes.TrimSpace(body.Action)) == 0 {
			return nil, state.Errorf(state.ErrInvalidParams, "action: required, the action object {tool, ...}")
		}
		return c.serveLocked(oeMessage{Type: oeStep, Data: body.Action})
	case oeClose:
		return c.serveLocked(oeMessage{Type: oeDiscard})
	}
	return c.serveLocked(oeMessage{Type: typ})
}
