package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/arbor-env/arbor/server"
)

// Conformance cases named after OpenEnv's client calls
// (meta-pytorch/OpenEnv, src/openenv/core: env_client.py,
// mcp_client.py, env_server/mcp_types.py and types.py), each driven the
// way that client drives the endpoint; the client here is written from
// those files, not copied.

// MCPToolClient.list_tools: step(ListToolsAction()) sends the step
// {"type": "list_tools"} (no reset needed) and reads observation.tools
// [{name, description, input_schema}].
func TestOEMCPToolClientListTools(t *testing.T) {
	base, _ := oeBase(t, server.Options{})
	c := oeMustDial(t, base, "")
	d := c.ok("step", map[string]any{"type": "list_tools"}, "observation")
	obs, _ := d["observation"].(map[string]any)
	tools, _ := obs["tools"].([]any)
	names := map[string]map[string]any{}
	for _, x := range tools {
		tl := x.(map[string]any)
		schema, _ := tl["input_schema"].(map[string]any)
		if tl["description"] == "" || schema["type"] != "object" {
			t.Errorf("tool %v: want a description and an object input_schema", tl)
		}
		names[tl["name"].(string)] = schema
	}
	for _, n := range []string{"bash", "write_file", "read_file", "rollback", "submit"} {
		if names[n] == nil {
			t.Errorf("list_tools: no %s in %v", n, tools)
		}
	}
	if req, _ := names["bash"]["required"].([]any); len(req) != 1 || req[0] != "cmd" {
		t.Errorf("bash's input_schema: %v", names["bash"])
	}
	if d["done"] != false || d["reward"] != nil {
		t.Errorf("list_tools: %v", d)
	}
}

// MCPToolClient.call_tool(name, **kwargs): the step {"type": "call_tool",
// tool_name, arguments}; it returns observation.result["data"] and
// raises on observation.error {error_type, message}. A call is a turn.
func TestOEMCPToolClientCallTool(t *testing.T) {
	base, _ := oeBase(t, server.Options{})
	c := oeMustDial(t, base, "")
	call := func(name string, args map[string]any) (obs map[string]any, d map[string]any) {
		t.Helper()
		d = c.ok("step", map[string]any{"type": "call_tool", "tool_name": name, "arguments": args}, "observation")
		obs, _ = d["observation"].(map[string]any)
		if obs["tool_name"] != name {
			t.Fatalf("call_tool %s: %v", name, d)
		}
		return obs, d
	}
	c.fails("step", map[string]any{"type": "call_tool", "tool_name": "bash", "arguments": map[string]any{"cmd": "ls"}}, "bad_request") // before reset
	c.ok("reset", nil, "observation")
	obs, d := call("bash", map[string]any{"cmd": "echo 3 > /work/n; echo hi; (exit 2)"})
	res, _ := obs["result"].(map[string]any)
	data, _ := res["data"].(map[string]any)
	meta, _ := d["metadata"].(map[string]any)
	if obs["error"] != nil || data["stdout"] != "hi\n" || data["exit_code"] != 2.0 || res["is_error"] != true || meta["turn"] != 1.0 || d["done"] != false {
		t.Fatalf("call_tool bash: %v", d)
	}
	obs, _ = call("write_file", map[string]any{"path": "/work/t", "content": "x<y"})
	if obs["error"] != nil {
		t.Errorf("call_tool write_file: %v", obs)
	}
	obs, d = call("read_file", map[string]any{"path": "/work/t"})
	if data := obs["result"].(map[string]any)["data"].(map[string]any); data["stdout"] != "x<y" || d["metadata"].(map[string]any)["turn"] != 3.0 {
		t.Errorf("call_tool read_file: %v", d)
	}
	// Calls that cannot be made are the observation's error.
	if obs, _ = call("telnet", nil); obs["error"].(map[string]any)["error_type"] != "tool_not_found" {
		t.Errorf("unknown tool: %v", obs)
	}
	if obs, _ = call("bash", map[string]any{"cmd": 5}); obs["error"].(map[string]any)["error_type"] != "invalid_args" {
		t.Errorf("bad arguments: %v", obs)
	}
	c.fails("step", map[string]any{"type": "dance"}, "invalid_params")
	// submit ends the episode with the verifier's reward.
	_, d = call("submit", nil)
	if d["done"] != true || d["reward"] != 1.0 {
		t.Errorf("call_tool submit: %v", d)
	}
}

// The "mcp" message (WSMCPMessage): JSON-RPC tools/list and tools/call,
// answered {"type": "mcp", "data": JSON-RPC response}.
func TestOEMCPMessage(t *testing.T) {
	base, _ := oeBase(t, server.Options{})
	c := oeMustDial(t, base, "")
	rpc := func(method string, params any, id int) map[string]any {
		t.Helper()
		return c.ok("mcp", map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": id}, "mcp")
	}
	l := rpc("tools/list", map[string]any{}, 1)
	tools, _ := l["result"].(map[string]any)["tools"].([]any)
	if l["jsonrpc"] != "2.0" || l["id"] != 1.0 || len(tools) != 5 || tools[0].(map[string]any)["inputSchema"] == nil {
		t.Errorf("tools/list: %v", l)
	}
	if e := rpc("tools/call", map[string]any{"name": "bash", "arguments": map[string]any{"cmd": "true"}}, 2); e["error"].(map[string]any)["code"] != -32000.0 {
		t.Errorf("tools/call before reset: %v", e)
	}
	c.ok("reset", nil, "observation")
	r := rpc("tools/call", map[string]any{"name": "bash", "arguments": map[string]any{"cmd": "echo hi"}}, 3)
	res, _ := r["result"].(map[string]any)
	content, _ := res["content"].([]any)
	if r["id"] != 3.0 || len(content) == 0 || content[0].(map[string]any)["text"] != "hi\n" || res["isError"] != false ||
		res["structuredContent"].(map[string]any)["exit_code"] != 0.0 {
		t.Errorf("tools/call: %v", r)
	}
	if st := c.ok("state", nil, "state"); st["step_count"] != 1.0 {
		t.Errorf("a tools/call is a turn: state %v", st)
	}
	for _, tt := range []struct {
		name   string
		method string
		params any
		code   float64
	}{
		{"unknown method", "tools/dance", nil, -32601},
		{"no name", "tools/call", map[string]any{}, -32602},
		{"unknown tool", "tools/call", map[string]any{"name": "telnet"}, -32602},
		{"bad arguments", "tools/call", map[string]any{"name": "bash", "arguments": map[string]any{"cmd": 5}}, -32602},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := rpc(tt.method, tt.params, 9)
			if eo, _ := e["error"].(map[string]any); eo == nil || eo["code"] != tt.code || eo["message"] == "" || e["id"] != 9.0 {
				t.Errorf("%s: %v, want JSON-RPC error %v", tt.method, e, tt.code)
			}
		})
	}
	if a := c.raw(`{"type": "mcp", "data": {"params": {}}}`); a.Type != "mcp" || a.Data["error"].(map[string]any)["code"] != -32600.0 {
		t.Errorf("a request without a method: %v", a)
	}
}

// EnvClient._send_and_receive raises RuntimeError("Server error: MESSAGE
// (code: CODE)") with OpenEnv's codes (WSErrorCode); Arbor's code comes
// along as arbor_code.
func TestOEErrorCodes(t *testing.T) {
	base, _ := oeBase(t, server.Options{})
	c := oeMustDial(t, base, "")
	for _, tt := range []struct {
		name, frame, code, arbor string
	}{
		{"not JSON", `{"type": `, "INVALID_JSON", "malformed"},
		{"unknown type", `{"type": "dance"}`, "UNKNOWN_TYPE", "unknown_method"},
		{"bad action", `{"type": "step", "data": "ls"}`, "VALIDATION_ERROR", "invalid_params"},
		{"step before reset", `{"type": "step", "data": {"tool": "bash", "cmd": "ls"}}`, "EXECUTION_ERROR", "bad_request"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := c.raw(tt.frame)
			if a.Type != "error" || a.Data["code"] != tt.code || a.Data["arbor_code"] != tt.arbor || a.Data["message"] == "" {
				t.Errorf("%s: %v, want code %s, arbor_code %s", tt.frame, a, tt.code, tt.arbor)
			}
		})
	}
}

// oePost is OpenEnv's HTTP client side: POST a JSON body to u, with the
// headers h (a token) when given.
func oePost(t *testing.T, u string, body any, h ...http.Header) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, hh := range h {
		for k, v := range hh {
			req.Header[k] = v
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("POST %s: %d %q is not JSON", u, resp.StatusCode, raw)
	}
	return resp.StatusCode, m
}

// The HTTP routes: POST /reset (ResetRequest), POST /step (StepRequest
// {action} and the session_id reset gave), GET /state, POST /close.
func TestOEHTTPResetStepState(t *testing.T) {
	base, _ := oeBase(t, server.Options{})
	code, r := oePost(t, base+"/reset", map[string]any{"seed": 5, "episode_id": "h1"})
	obs, meta, reward, done := obsOf(t, r)
	sess, _ := meta["session_id"].(string)
	if code != 200 || sess == "" || obs["instruction"] == "" || reward != nil || done {
		t.Fatalf("POST reset: %d %v", code, r)
	}
	code, r = oePost(t, base+"/step", map[string]any{"action": bash("echo $ARBOR_SEED; echo 3 > /work/n"), "session_id": sess})
	if obs, meta, _, done := obsOf(t, r); code != 200 || obs["stdout"] != "5\n" || meta["turn"] != 1.0 || done {
		t.Fatalf("POST step: %d %v", code, r)
	}
	if code, st := getJSON(t, base+"/state?session_id="+sess, nil); code != 200 || st["episode_id"] != "h1" || st["step_count"] != 1.0 {
		t.Errorf("GET state: %d %v", code, st)
	}
	// A websocket can attach to an HTTP session, and leave it to HTTP.
	k := oeMustDial(t, base, "?session="+sess)
	if st := k.ok("state", nil, "state"); st["step_count"] != 1.0 {
		t.Errorf("state by websocket: %v", st)
	}
	if code, e := oePost(t, base+"/step", map[string]any{"action": bash("true"), "session_id": sess}); code != 409 || e["arbor_code"] != "bad_request" {
		t.Errorf("POST step while a websocket drives the session: %d %v", code, e)
	}
	oeLeave(t, k)
	for _, tt := range []struct {
		name string
		body any
		code int
		oe   string
	}{
		{"no session", map[string]any{"action": bash("true")}, 422, "VALIDATION_ERROR"},
		{"unknown session", map[string]any{"action": bash("true"), "session_id": "enope"}, 404, "SESSION_ERROR"},
		{"no action", map[string]any{"session_id": sess}, 422, "VALIDATION_ERROR"},
		{"bad action", map[string]any{"action": map[string]any{"tool": "bash"}, "session_id": sess}, 422, "VALIDATION_ERROR"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if code, e := oePost(t, base+"/step", tt.body); code != tt.code || e["code"] != tt.oe || e["detail"] == "" {
				t.Errorf("POST step %v: %d %v, want %d %s", tt.body, code, e, tt.code, tt.oe)
			}
		})
	}
	code, r = oePost(t, base+"/step", map[string]any{"action": map[string]any{"tool": "submit"}, "session_id": sess})
	if _, _, reward, done := obsOf(t, r); code != 200 || reward != 1.0 || !done {
		t.Errorf("POST step submit: %d %v", code, r)
	}
	if code, e := oePost(t, base+"/step", map[string]any{"action": bash("true"), "session_id": sess}); code != 409 || e["code"] != "EXECUTION_ERROR" {
		t.Errorf("POST step after the end: %d %v", code, e)
	}
	if code, d := oePost(t, base+"/close", map[string]any{"session_id": sess}); code != 200 || d["discarded"] != true {
		t.Errorf("POST close: %d %v", code, d)
	}
	if code, _ := getJSON(t, base+"/state?session_id="+sess, nil); code != 404 {
		t.Errorf("GET state after close: %d, want 404", code)
	}
}

// oeLeave is EnvClient.disconnect: the message close, then the
// websocket's close handshake.
func oeLeave(t *testing.T, c *oeClient) {
	t.Helper()
	c.ws.WriteMessage(websocket.TextMessage, []byte(`{"type": "close"}`))
	c.ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	c.ws.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		if _, _, err := c.ws.ReadMessage(); err != nil {
			return
		}
	}
}

// GenericEnvClient on a branch child's base URL: a second connection is
// refused with an error answer (then closed, 1008); once the first
// client disconnected, a new one attaches; the children outlive the
// connection that made them.
func TestOEGenericEnvClientAttach(t *testing.T) {
	srv, addr := newServer(t, server.Options{})
	base := "http://" + addr + "/openenv/count"
	p := oeMustDial(t, base, "")
	p.ok("reset", nil, "observation")
	p.ok("step", bash("echo 3 > /work/n"), "observation")
	br := p.ok("branch", map[string]any{"n": 2}, "branch")
	paths := br["base_paths"].([]any)
	kid := "http://" + addr + paths[0].(string)
	oeLeave(t, p) // the parent's connection ends: its children live on

	w1 := oeMustDial(t, kid, "")
	if st := w1.ok("state", nil, "state"); st["step_count"] != 1.0 {
		t.Fatalf("child: %v", st)
	}
	w1.ok("step", bash("echo 4 > /work/n"), "observation")
	dup := oeMustDial(t, kid, "")
	a := dup.send("reset", nil)
	if a.Type != "error" || a.Data["arbor_code"] != "bad_request" || a.Data["code"] != "EXECUTION_ERROR" || !strings.Contains(a.Data["message"].(string), "driven by another connection") {
		t.Errorf("second attach: %v, want an error answer", a)
	}
	dup.ws.SetReadDeadline(time.Now().Add(time.Minute))
	if _, _, err := dup.ws.ReadMessage(); !websocket.IsCloseError(err, websocket.ClosePolicyViolation) {
		t.Errorf("after a refused attach: %v, want close 1008", err)
	}
	// Re-attaching after the first client left (disconnect: close, then
	// the close handshake) works at once, where the child is as left.
	for i := range 3 {
		oeLeave(t, w1)
		w1 = oeMustDial(t, kid, "")
		obs, meta, _, _ := obsOf(t, w1.ok("step", bash("cat /work/n"), "observation"))
		if obs["stdout"] != "4\n" || meta["turn"] != float64(3+i) {
			t.Fatalf("re-attach %d: %v %v", i, obs, meta)
		}
	}
	// The other child, never attached, lives on too.
	w2 := oeMustDial(t, "http://"+addr+paths[1].(string), "")
	if obs, _, _, _ := obsOf(t, w2.ok("step", bash("cat /work/n"), "observation")); obs["stdout"] != "3\n" {
		t.Errorf("second child: %v", obs)
	}
	w1.ok("discard", nil, "discard")
	gone := oeMustDial(t, kid, "")
	oeErrorOf(t, gone.send("state", nil), "unknown_env")
	// A child closed behind the endpoint's back (v1's close; the idle TTL
	// alike) is no session any more.
	oeLeave(t, w2)
	if err := dial(t, addr, nil).CloseEnv(context.Background(), br["sessions"].([]any)[1].(string)); err != nil {
		t.Fatal(err)
	}
	gone = oeMustDial(t, "http://"+addr+paths[1].(string), "")
	oeErrorOf(t, gone.send("state", nil), "unknown_env")

	// Sessions whose env was closed elsewhere are forgotten, not kept:
	// a branch child closed by v1 that nobody attaches to again is gone
	// from the endpoint's sessions after the next branch.
	p = oeMustDial(t, base, "")
	p.ok("reset", nil, "observation")
	br = p.ok("branch", map[string]any{"n": 1}, "branch")
	lost := br["sessions"].([]any)[0].(string)
	if err := dial(t, addr, nil).CloseEnv(context.Background(), lost); err != nil {
		t.Fatal(err)
	}
	br = p.ok("branch", map[string]any{"n": 1}, "branch")
	if held := srv.OpenEnvSessions(); slices.Contains(held, lost) || !slices.Contains(held, br["sessions"].([]any)[0].(string)) {
		t.Errorf("sessions after a child was closed by v1 and another branch: %v, want no %s", held, lost)
	}
}

// MCPToolClient in production mode (use_production_mode): JSON-RPC over
// POST /mcp: openenv/session/create, tools/list, tools/call with the
// session_id, openenv/session/close.
func TestOEMCPToolClientProductionMode(t *testing.T) {
	base, _ := oeBase(t, server.Options{})
	id := 0
	rpc := func(method string, params map[string]any) map[string]any {
		t.Helper()
		id++
		code, r := oePost(t, base+"/mcp", map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": id})
		if code != 200 || r["jsonrpc"] != "2.0" || r["id"] != float64(id) {
			t.Fatalf("POST mcp %s: %d %v", method, code, r)
		}
		return r
	}
	if tools, _ := rpc("tools/list", nil)["result"].(map[string]any)["tools"].([]any); len(tools) != 5 {
		t.Errorf("tools/list: %v", tools)
	}
	sess, _ := rpc("openenv/session/create", nil)["result"].(map[string]any)["session_id"].(string)
	if sess == "" {
		t.Fatal("openenv/session/create: no session_id")
	}
	r := rpc("tools/call", map[string]any{"name": "bash", "arguments": map[string]any{"cmd": "echo 3 > /work/n; cat /work/n"}, "session_id": sess})
	if res, _ := r["result"].(map[string]any); res == nil || res["data"].(map[string]any)["stdout"] != "3\n" {
		t.Errorf("tools/call: %v", r)
	}
	r = rpc("tools/call", map[string]any{"name": "submit", "session_id": sess})
	if meta, _ := r["result"].(map[string]any)["_meta"].(map[string]any)["arbor"].(map[string]any); meta["done"] != true || meta["reward"] != 1.0 {
		t.Errorf("tools/call submit: %v", r)
	}
	if e, _ := rpc("tools/call", map[string]any{"name": "bash", "arguments": map[string]any{"cmd": "true"}})["error"].(map[string]any); e["code"] != -32602.0 {
		t.Errorf("tools/call without a session: %v", e)
	}
	if res, _ := rpc("openenv/session/close", map[string]any{"session_id": sess})["result"].(map[string]any); res["closed"] != true {
		t.Errorf("openenv/session/close: %v", res)
	}
	e, _ := rpc("tools/call", map[string]any{"name": "bash", "arguments": map[string]any{"cmd": "true"}, "session_id": sess})["error"].(map[string]any)
	if d, _ := e["data"].(map[string]any); d["arbor_code"] != "unknown_env" || d["code"] != "SESSION_ERROR" {
		t.Errorf("tools/call after close: %v", e)
	}
}
