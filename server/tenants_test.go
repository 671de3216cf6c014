package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/agent"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server"
)

const tenantTokens = `# two teams and an operator
tok-alpha alpha
tok-beta  beta
tok-ops   ops admin
`

// Ids nobody made, of the shape of real ones, to compare answers with.
const (
	nobodysEnv   = "0badc0ffee00"
	nobodysState = "s-0badc0ffee00"
)

// tenantServer is a server with the tokens above, serving protocol v1,
// OpenEnv, the web view and the agent tools over MCP on one coordinator.
func tenantServer(t *testing.T) (addr string, co *coordinator.Coordinator) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	toks, err := tenant.Parse(strings.NewReader(tenantTokens))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	co, err = coordinator.New(coordinator.Options{Engine: engine, Tasks: coordinator.FromEnvpool(pool), Classify: coordinator.Full,
		Registry: reg, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	tools, err := agent.New(agent.Options{Coordinator: co, Logger: quiet()})
	if err != nil {
		co.Close()
		t.Fatal(err)
	}
	h := tools.Handler(agent.HandlerOptions{Tokens: toks, Logger: quiet()})
	s, err := server.New(server.Options{Coordinator: co, Tokens: toks, Registry: reg, Logger: quiet(),
		Handlers: map[string]http.Handler{agent.MCPPath: h, agent.MCPPath + "/": h}})
	if err != nil {
		co.Close()
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h.Close(ctx)
		s.Shutdown(ctx)
		hs.Close()
		co.Close()
	})
	return strings.TrimPrefix(hs.URL, "http://"), co
}

func dialAs(t *testing.T, addr, token string) *arbor.Client {
	t.Helper()
	c, err := arbor.Dial(context.Background(), addr, &arbor.Options{Token: token})
	if err != nil {
		t.Fatalf("dial with %s: %v", token, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sameAsUnknown checks that err (an operation on another tenant's id) is
// the answer the same operation gets for an id nobody made: same code,
// same message once the ids are swapped.
func sameAsUnknown(t *testing.T, what string, err, unknown error, id, nobodys string) {
	t.Helper()
	var pe, pu *arbor.Error
	if !errors.As(err, &pe) || !errors.As(unknown, &pu) {
		t.Errorf("%s: %v / unknown id: %v, want protocol errors", what, err, unknown)
		return
	}
	if pe.Code != pu.Code || pe.Code != "unknown_env" && pe.Code != "unknown_state" {
		t.Errorf("%s: code %s, an unknown id's %s", what, pe.Code, pu.Code)
	}
	if got, want := strings.ReplaceAll(pe.Message, id, "ID"), strings.ReplaceAll(pu.Message, nobodys, "ID"); got != want {
		t.Errorf("%s: message %q, an unknown id's %q", what, got, want)
	}
}

func envIDs(t *testing.T, c *arbor.Client) []string {
	t.Helper()
	envs, err := c.Envs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range envs {
		ids = append(ids, e.EnvID)
	}
	return ids
}

// TestTenants: two tokens of two tenants on one server; each sees and
// touches only its own envs and states, through protocol v1, the web
// view, OpenEnv and MCP, and is answered about the other's ids exactly as
// about ids nobody made. The admin token sees and drives both.
func TestTenants(t *testing.T) {
	addr, _ := tenantServer(t)
	ctx := context.Background()
	a, b, ops := dialAs(t, addr, "tok-alpha"), dialAs(t, addr, "tok-beta"), dialAs(t, addr, "tok-ops")
	bash := func(cmd string) arbor.Action { return arbor.Action{Tool: "bash", Cmd: cmd} }

	ra, err := a.Reset(ctx, arbor.ResetParams{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	envA := ra.EnvID
	stA, err := a.StepKeyed(ctx, envA, "k1", bash("echo 1 > /work/n"))
	if err != nil {
		t.Fatal(err)
	}
	sA := stA.Info.StateID
	rb, err := b.Reset(ctx, arbor.ResetParams{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	envB := rb.EnvID
	stB, err := b.Step(ctx, envB, bash("echo 2 > /work/n"))
	if err != nil {
		t.Fatal(err)
	}
	sB := stB.Info.StateID

	t.Run("v1", func(t *testing.T) {
		if got := envIDs(t, a); !slices.Equal(got, []string{envA}) {
			t.Errorf("alpha's envs: %v, want [%s]", got, envA)
		}
		if got := envIDs(t, b); !slices.Equal(got, []string{envB}) {
			t.Errorf("beta's envs: %v, want [%s]", got, envB)
		}
		if got := envIDs(t, ops); !slices.Contains(got, envA) || !slices.Contains(got, envB) {
			t.Errorf("the admin's envs: %v, want both %s and %s", got, envA, envB)
		}
		// Every operation beta can name alpha's env with.
		envOps := []struct {
			name string
			op   func(env string) error
		}{
			{"step", func(e string) error { _, err := b.Step(ctx, e, bash("cat /work/n")); return err }},
			{"keyed step replay", func(e string) error { _, err := b.StepKeyed(ctx, e, "k1", bash("echo 1 > /work/n")); return err }},
			{"rollback", func(e string) error { _, err := b.Rollback(ctx, e, sA); return err }},
			{"branch", func(e string) error { _, err := b.Branch(ctx, arbor.BranchParams{EnvID: e, N: 1}); return err }},
			{"checkpoint", func(e string) error { _, err := b.Checkpoint(ctx, e); return err }},
			{"states", func(e string) error { _, err := b.States(ctx, e); return err }},
			{"trajectory", func(e string) error { _, err := b.Trajectory(ctx, e); return err }},
			{"evaluate", func(e string) error { _, err := b.Evaluate(ctx, e); return err }},
			{"promote", func(e string) error { _, err := b.Promote(ctx, e); return err }},
			{"discard", func(e string) error { return b.Discard(ctx, e) }},
			{"close", func(e string) error { return b.CloseEnv(ctx, e) }},
		}
		for _, tt := range envOps {
			sameAsUnknown(t, tt.name, tt.op(envA), tt.op(nobodysEnv), envA, nobodysEnv)
		}
		var item arbor.BatchItemResult
		if _, err := b.StepBatch(ctx, []arbor.BatchItem{{EnvID: envA, Action: bash("cat /work/n")}}, func(r arbor.BatchItemResult) { item = r }); err != nil {
			t.Errorf("step_batch: %v", err)
		} else if item.Error == nil || item.Error.Code != "unknown_env" {
			t.Errorf("step_batch item on alpha's env: %+v, want unknown_env", item)
		}
		// Every operation beta can name alpha's state with.
		stateOps := []struct {
			name string
			op   func(s string) error
		}{
			{"branch from state", func(s string) error { _, err := b.Branch(ctx, arbor.BranchParams{StateID: s, N: 1}); return err }},
			{"rollback to state", func(s string) error { _, err := b.Rollback(ctx, envB, s); return err }},
			{"release", func(s string) error { return b.Release(ctx, s) }},
			{"pin", func(s string) error { return b.Pin(ctx, s) }},
			{"unpin", func(s string) error { return b.Unpin(ctx, s) }},
			{"prepare", func(s string) error { _, err := b.Prepare(ctx, []string{s}, 1, false); return err }},
			{"state trajectory", func(s string) error { _, err := b.StateTrajectory(ctx, s); return err }},
		}
		for _, tt := range stateOps {
			sameAsUnknown(t, tt.name, tt.op(sA), tt.op(nobodysState), sA, nobodysState)
		}
		// The rollback tool refuses alpha's state as one nobody made.
		other, err1 := b.Step(ctx, envB, arbor.Action{Tool: "rollback", StateID: sA})
		unknown, err2 := b.Step(ctx, envB, arbor.Action{Tool: "rollback", StateID: nobodysState})
		if err1 != nil || err2 != nil || other.Obs.ExitCode == 0 ||
			strings.ReplaceAll(string(other.Obs.Stderr), sA, "ID") != strings.ReplaceAll(string(unknown.Obs.Stderr), nobodysState, "ID") {
			t.Errorf("rollback tool to alpha's state: %+v %v; to an unknown one: %+v %v", other, err1, unknown, err2)
		}

		// Alpha's env is untouched and alpha drives it.
		if r, err := a.Step(ctx, envA, bash("cat /work/n")); err != nil || r.Obs.Stdout != "1\n" {
			t.Errorf("alpha's step after beta's tries: %+v %v", r, err)
		}
		if _, err := a.Rollback(ctx, envA, sA); err != nil {
			t.Errorf("alpha's rollback to its own state: %v", err)
		}
		// The admin drives alpha's env; a child it branches is alpha's.
		br, err := ops.Branch(ctx, arbor.BranchParams{EnvID: envA, N: 1})
		if err != nil {
			t.Fatalf("admin branch of alpha's env: %v", err)
		}
		child := br.EnvIDs[0]
		if got := envIDs(t, a); !slices.Contains(got, child) {
			t.Errorf("alpha's envs %v lack the child %s the admin branched from its env", got, child)
		}
		if got := envIDs(t, b); slices.Contains(got, child) {
			t.Errorf("beta sees alpha's child %s", child)
		}
		// A branch from a state inherits the state's tenant.
		bs, err := a.Branch(ctx, arbor.BranchParams{StateID: sA, N: 1})
		if err != nil {
			t.Fatalf("alpha's branch from its state: %v", err)
		}
		if got := envIDs(t, b); slices.Contains(got, bs.EnvIDs[0]) {
			t.Errorf("beta sees alpha's branch %s", bs.EnvIDs[0])
		}
		for _, id := range append(br.EnvIDs, bs.EnvIDs...) {
			a.CloseEnv(ctx, id)
		}
		if _, err := b.Rollback(ctx, envB, sB); err != nil {
			t.Errorf("beta's rollback to its own state: %v", err)
		}

		// A state (pinned) stays its tenant's after its env closed.
		rx, err := a.Reset(ctx, arbor.ResetParams{Task: "count"})
		if err != nil {
			t.Fatal(err)
		}
		sx, err := a.Step(ctx, rx.EnvID, bash("echo 2 > /work/n"))
		if err != nil {
			t.Fatal(err)
		}
		closed := sx.Info.StateID
		if err := a.Pin(ctx, closed); err != nil { // kept through the close
			t.Fatal(err)
		}
		defer a.Unpin(ctx, closed)
		if err := a.CloseEnv(ctx, rx.EnvID); err != nil {
			t.Fatal(err)
		}
		fromState := func(s string) error { _, err := b.Branch(ctx, arbor.BranchParams{StateID: s, N: 1}); return err }
		sameAsUnknown(t, "branch from a state of alpha's closed env", fromState(closed), fromState(nobodysState), closed, nobodysState)
		if r, err := a.Branch(ctx, arbor.BranchParams{StateID: closed, N: 1}); err != nil {
			t.Errorf("alpha's branch from a state of its closed env: %v", err)
		} else {
			a.CloseEnv(ctx, r.EnvIDs[0])
		}
	})

	t.Run("metrics", func(t *testing.T) {
		resp := get(t, "http://"+addr+"/metrics", nil)
		b, _ := io.ReadAll(resp.Body)
		for _, want := range []string{`arbor_tenant_envs{tenant="alpha"} 1`, `arbor_tenant_envs{tenant="beta"} 1`} {
			if !strings.Contains(string(b), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	t.Run("web view", func(t *testing.T) {
		base := "http://" + addr
		as := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
		rows := func(tok string) []string {
			resp := get(t, base+"/ui/api/envs", as(tok))
			var ans struct {
				Envs []struct{ ID string }
			}
			if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || resp.StatusCode != 200 {
				t.Fatalf("/ui/api/envs as %s: %d %v", tok, resp.StatusCode, err)
			}
			var ids []string
			for _, e := range ans.Envs {
				ids = append(ids, e.ID)
			}
			return ids
		}
		if got := rows("tok-alpha"); !slices.Equal(got, []string{envA}) {
			t.Errorf("alpha's web view: %v, want [%s]", got, envA)
		}
		if got := rows("tok-beta"); !slices.Equal(got, []string{envB}) {
			t.Errorf("beta's web view: %v, want [%s]", got, envB)
		}
		if got := rows("tok-ops"); !slices.Contains(got, envA) || !slices.Contains(got, envB) {
			t.Errorf("the admin's web view: %v", got)
		}
		body := func(resp *http.Response) string { b, _ := io.ReadAll(resp.Body); return string(b) }
		same := func(what, path, id, nobodys string) {
			t.Helper()
			other := get(t, base+strings.ReplaceAll(path, "ID", id), as("tok-beta"))
			unknown := get(t, base+strings.ReplaceAll(path, "ID", nobodys), as("tok-beta"))
			ob, ub := body(other), body(unknown)
			if other.StatusCode != unknown.StatusCode || strings.ReplaceAll(ob, id, "ID") != strings.ReplaceAll(ub, nobodys, "ID") {
				t.Errorf("%s of alpha's id: %d %q; of an unknown id: %d %q", what, other.StatusCode, ob, unknown.StatusCode, ub)
			}
		}
		same("tree", "/ui/api/tree?env=ID", envA, nobodysEnv)
		same("diff", "/ui/api/diff?a=ID&b="+url.QueryEscape(sB), sA, nobodysState)
		if resp := get(t, base+"/ui/api/tree?env="+envA, as("tok-alpha")); resp.StatusCode != 200 {
			t.Errorf("alpha's tree of its env: %d", resp.StatusCode)
		}
		// The task's tree shows each tenant its own envs only.
		resp := get(t, base+"/ui/api/tree?task=count", as("tok-beta"))
		if tb := body(resp); resp.StatusCode != 200 || strings.Contains(tb, envA) || !strings.Contains(tb, envB) {
			t.Errorf("beta's tree of the task: %d %s", resp.StatusCode, tb)
		}

		// The event stream carries beta's changes, not alpha's.
		ectx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ectx, "GET", base+"/ui/api/events", nil)
		req.Header = as("tok-beta")
		ev, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer ev.Body.Close()
		sc := bufio.NewScanner(ev.Body)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "event: health") {
		}
		if _, err := a.Step(ctx, envA, bash("echo alpha")); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Step(ctx, envB, bash("echo beta")); err != nil {
			t.Fatal(err)
		}
		sawB := false
		for !sawB && sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, envA) {
				t.Errorf("beta's event stream: %s", line)
			}
			sawB = strings.HasPrefix(line, "data: ") && strings.Contains(line, envB)
		}
		if !sawB {
			t.Errorf("beta's event stream ended without beta's step: %v", sc.Err())
		}
	})

	t.Run("openenv", func(t *testing.T) {
		base := "http://" + addr + "/openenv/count"
		as := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
		ca, _, err := oeDial(t, base, "", as("tok-alpha"))
		if err != nil {
			t.Fatal(err)
		}
		_, meta, _, _ := obsOf(t, ca.ok("reset", nil, "observation"))
		sess := meta["session_id"].(string)
		br := ca.ok("branch", map[string]any{"n": 1}, "branch")
		kids, _ := br["sessions"].([]any)
		if len(kids) != 1 {
			t.Fatalf("branch: %v", br)
		}
		kid := kids[0].(string)
		if got := envIDs(t, a); !slices.Contains(got, sess) || !slices.Contains(got, kid) {
			t.Errorf("alpha's envs %v lack its OpenEnv session %s or child %s", got, sess, kid)
		}
		if got := envIDs(t, b); slices.Contains(got, sess) || slices.Contains(got, kid) {
			t.Errorf("beta sees alpha's OpenEnv sessions: %v", got)
		}
		// Beta attaching to alpha's child is answered as a session that
		// does not exist.
		attach := func(id string) map[string]any {
			c, _, err := oeDial(t, base, "?session="+id, as("tok-beta"))
			if err != nil {
				t.Fatal(err)
			}
			// A refused attach answers the client's first message
			// (docs/openenv.md, "Sessions").
			if err := c.ws.WriteMessage(websocket.TextMessage, []byte(`{"type": "state", "data": {}}`)); err != nil {
				t.Fatalf("attach %s: %v", id, err)
			}
			c.ws.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, m, err := c.ws.ReadMessage()
			if err != nil {
				t.Fatalf("attach %s: %v", id, err)
			}
			var ans oeAnswer
			json.Unmarshal(m, &ans)
			return oeErrorOf(t, ans, "unknown_env")
		}
		other, unknown := attach(kid), attach(nobodysEnv)
		if strings.ReplaceAll(other["message"].(string), kid, "ID") != strings.ReplaceAll(unknown["message"].(string), nobodysEnv, "ID") {
			t.Errorf("attach to alpha's session: %v; to an unknown one: %v", other, unknown)
		}
		// Nor over OpenEnv's HTTP routes and its MCP route: step, state,
		// close and tools/call on alpha's session are unknown_env for
		// beta, as for an id nobody has, and alpha's session goes on.
		req, _ := http.NewRequest(http.MethodGet, base+"/state?session_id="+sess, nil)
		req.Header = as("tok-beta")
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode < 400 {
			t.Errorf("beta's GET /state of alpha's session: %v %v, want refused", resp, err)
		} else {
			resp.Body.Close()
		}
		for _, path := range []string{"/step", "/close"} {
			body := map[string]any{"session_id": sess, "action": map[string]any{"tool": "bash", "cmd": "touch /tmp/beta-was-here"}}
			code, ans := oePost(t, base+path, body, as("tok-beta"))
			if code < 400 || ans["arbor_code"] != "unknown_env" {
				t.Errorf("beta's POST %s on alpha's session: %d %v, want unknown_env", path, code, ans)
			}
		}
		call := map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
			"params": map[string]any{"session_id": sess, "name": "bash", "arguments": map[string]any{"cmd": "touch /tmp/beta-was-here"}}}
		if _, ans := oePost(t, base+"/mcp", call, as("tok-beta")); ans["error"] == nil {
			t.Errorf("beta's tools/call on alpha's session: %v, want an error", ans)
		}
		if obs, _, _, _ := obsOf(t, ca.ok("step", map[string]any{"tool": "bash", "cmd": "test ! -e /tmp/beta-was-here && echo clean"}, "observation")); obs["stdout"] != "clean\n" {
			t.Errorf("alpha's session after beta's tries: %v, want it open and untouched", obs)
		}
		// Beta's own session cannot roll back to alpha's state.
		cb, _, err := oeDial(t, base, "", as("tok-beta"))
		if err != nil {
			t.Fatal(err)
		}
		cb.ok("reset", nil, "observation")
		o := cb.fails("rollback", map[string]any{"state_id": sA}, "unknown_state")
		u := cb.fails("rollback", map[string]any{"state_id": nobodysState}, "unknown_state")
		if strings.ReplaceAll(o["message"].(string), sA, "ID") != strings.ReplaceAll(u["message"].(string), nobodysState, "ID") {
			t.Errorf("OpenEnv rollback to alpha's state: %v; to an unknown one: %v", o, u)
		}
		// Alpha attaches to its own child.
		ck, _, err := oeDial(t, base, "?session="+kid, as("tok-alpha"))
		if err != nil {
			t.Fatal(err)
		}
		if st := ck.ok("state", nil, "state"); st["session_id"] != kid {
			t.Errorf("alpha's attach to its child: %v", st)
		}
	})

	t.Run("mcp", func(t *testing.T) {
		mcpURL := "http://" + addr + agent.MCPPath
		// Beta's attach to alpha's env is refused as to an env nobody
		// made.
		status := func(path, tok string) (int, string) {
			req, _ := http.NewRequest("POST", mcpURL+path, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		oc, ob := status("/"+envA, "tok-beta")
		uc, ub := status("/"+nobodysEnv, "tok-beta")
		if oc != http.StatusNotFound || oc != uc || strings.ReplaceAll(ob, envA, "ID") != strings.ReplaceAll(ub, nobodysEnv, "ID") {
			t.Errorf("beta's MCP attach to alpha's env: %d %q; to an unknown env: %d %q", oc, ob, uc, ub)
		}
		// Alpha attaches to its own env.
		var tok atomic.Value
		tok.Store("tok-alpha")
		cli := mcp.NewClient(&mcp.Implementation{Name: "arbor-test", Version: "0"}, nil)
		cs, err := cli.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: mcpURL + "/" + envA,
			HTTPClient: &http.Client{Transport: switchBearer{&tok}}, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"cmd": "cat /work/n"}})
		if err != nil || r.IsError {
			t.Fatalf("alpha's bash over MCP: %v %v", r, err)
		}
		// Beta's token on alpha's session: refused.
		tok.Store("tok-beta")
		if r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"cmd": "echo hijack > /work/n"}}); err == nil && !r.IsError {
			t.Errorf("beta's token on alpha's MCP session ran: %v", r.Content)
		}
		tok.Store("tok-alpha")
		if st, err := a.Step(ctx, envA, bash("cat /work/n")); err != nil || strings.Contains(string(st.Obs.Stdout), "hijack") {
			t.Errorf("alpha's env after beta's try: %+v %v", st, err)
		}

		// Beta's own session env is beta's.
		var tb atomic.Value
		tb.Store("tok-beta")
		csb, err := cli.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: mcpURL + "?task=count",
			HTTPClient: &http.Client{Transport: switchBearer{&tb}}, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer csb.Close()
		r, err = csb.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"cmd": "true"}})
		if err != nil || r.IsError || len(r.Content) == 0 {
			t.Fatalf("beta's bash in its own MCP env: %v %v", r, err)
		}
		intro := r.Content[0].(*mcp.TextContent).Text
		mcpEnv, _, _ := strings.Cut(strings.TrimPrefix(intro, "[new sandbox "), " ")
		bEnvs, aEnvs := envIDs(t, b), envIDs(t, a)
		if !slices.Contains(bEnvs, mcpEnv) {
			t.Errorf("beta's envs %v lack its MCP session's env %s (%q)", bEnvs, mcpEnv, intro)
		}
		for _, id := range bEnvs {
			if slices.Contains(aEnvs, id) {
				t.Errorf("alpha sees beta's env %s", id)
			}
		}
	})
}

// switchBearer adds the token held in tok to every request.
type switchBearer struct{ tok *atomic.Value }

func (s switchBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+s.tok.Load().(string))
	return http.DefaultTransport.RoundTrip(r)
}

// TestTenantsDefault: without a tokens file, one token (or none on
// loopback) is one tenant that sees every env, as before tenants.
func TestTenantsDefault(t *testing.T) {
	_, addr := newServer(t, server.Options{Token: "sesame"})
	ctx := context.Background()
	c1, c2 := dialAs(t, addr, "sesame"), dialAs(t, addr, "sesame")
	r, err := c1.Reset(ctx, arbor.ResetParams{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.CloseEnv(ctx, r.EnvID)
	if got := envIDs(t, c2); !slices.Contains(got, r.EnvID) {
		t.Errorf("another connection with the one token: envs %v lack %s", got, r.EnvID)
	}
	if _, err := c2.Step(ctx, r.EnvID, arbor.Action{Tool: "bash", Cmd: "true"}); err != nil {
		t.Errorf("another connection with the one token: step: %v", err)
	}
	if _, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/v1/ws", http.Header{"Authorization": {"Bearer wrong"}}); err == nil {
		t.Error("a wrong token was accepted")
	}
}
