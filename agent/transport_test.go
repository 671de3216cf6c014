package agent_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/arbor-env/arbor/agent"
	"github.com/arbor-env/arbor/envpool"
)

// Two tasks for the transport's tests: a session made for one is not
// served on the other.
var (
	instructionA   = "Write the answer to /work/answer.txt."
	transportTasks = []envpool.Task{
		{Name: "mcp-a", Image: "busybox", Instruction: instructionA},
		{Name: "mcp-b", Image: "busybox", Instruction: "Something else."},
	}
)

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`

// post sends one JSON-RPC message as the Streamable HTTP transport does,
// with session id sid (none if empty) and extra headers.
func post(t *testing.T, url, sid, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	return send(t, "POST", url, sid, body, hdr...)
}

func send(t *testing.T, method, url, sid, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// initialize opens a session on url and returns its id.
func initialize(t *testing.T, url string) string {
	t.Helper()
	resp, body := post(t, url, "", initializeBody)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize %s: status %d, session id %q: %s", url, resp.StatusCode, sid, body)
	}
	if resp, body := post(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: status %d: %s", resp.StatusCode, body)
	}
	t.Cleanup(func() { send(t, "DELETE", url, sid, "") })
	return sid
}

// TestMCPTransport: the endpoint follows the Streamable HTTP transport of
// the MCP specification (basic/transports: security warning, session
// management): a foreign Origin is refused (403), a request without a
// session id other than initialize is a bad request (400), an unknown or
// terminated session is not found (404), and a session is served only on
// the URL (task, image or env) it was made for (400 naming both).
func TestMCPTransport(t *testing.T) {
	s := newTaskServer(t, "", transportTasks...)
	base := "http://" + s.addr + agent.MCPPath
	urlA, urlB := base+"?task=mcp-a", base+"?task=mcp-b"
	sid := initialize(t, urlA)
	env := resetEnv(t, s.addr, "")
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`

	for _, tt := range []struct {
		name, method, url, sid, body string
		hdr                          []string
		status                       int
		says                         []string // the answer's body names these
	}{
		{name: "served on its own task", method: "POST", url: urlA, sid: sid, body: list, status: http.StatusOK, says: []string{`"bash"`}},
		{name: "foreign Origin, initialize", method: "POST", url: urlA, body: initializeBody, hdr: []string{"Origin", "https://evil.example"}, status: http.StatusForbidden},
		{name: "foreign Origin, in a session", method: "POST", url: urlA, sid: sid, body: list, hdr: []string{"Origin", "https://evil.example"}, status: http.StatusForbidden},
		{name: "foreign Origin, DELETE", method: "DELETE", url: urlA, sid: sid, hdr: []string{"Origin", "http://evil.example"}, status: http.StatusForbidden},
		{name: "no session id, tools/list", method: "POST", url: urlA, body: list, status: http.StatusBadRequest, says: []string{"Mcp-Session-Id"}},
		{name: "no session id, a notification", method: "POST", url: urlA, body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`, status: http.StatusBadRequest},
		{name: "no session id, tools/call", method: "POST", url: urlA, body: `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"bash","arguments":{"cmd":"true"}}}`, status: http.StatusBadRequest},
		{name: "no session id, params not an object", method: "POST", url: urlA, body: `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":[]}`, status: http.StatusBadRequest},
		// A session-less request of protocol 2026-07-28 gets the SDK's
		// answer: the versions this server speaks, so the client falls back
		// to initialize.
		{name: "no session id, a 2026-07-28 request", method: "POST", url: urlA, body: `{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`,
			hdr: []string{"Mcp-Protocol-Version", "2026-07-28"}, status: http.StatusBadRequest, says: []string{`"supported":["2025-11-25"`}},
		{name: "no session id, GET", method: "GET", url: urlA, status: http.StatusBadRequest},
		{name: "unknown session id", method: "POST", url: urlA, sid: "no-such-session", body: list, status: http.StatusNotFound},
		{name: "another task's URL", method: "POST", url: urlB, sid: sid, body: list, status: http.StatusBadRequest, says: []string{"task=mcp-a", "task=mcp-b"}},
		{name: "an image's URL", method: "POST", url: base + "?image=busybox", sid: sid, body: list, status: http.StatusBadRequest, says: []string{"task=mcp-a", "image=busybox"}},
		{name: "an env's URL", method: "POST", url: base + "/" + env, sid: sid, body: list, status: http.StatusBadRequest, says: []string{"task=mcp-a", env}},
		{name: "the bare URL", method: "POST", url: base, sid: sid, body: list, status: http.StatusBadRequest},
		{name: "DELETE on another task's URL", method: "DELETE", url: urlB, sid: sid, status: http.StatusBadRequest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := send(t, tt.method, tt.url, tt.sid, tt.body, tt.hdr...)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tt.status)
			}
			for _, w := range tt.says {
				if !strings.Contains(body, w) {
					t.Errorf("answer %q does not name %q", body, w)
				}
			}
		})
	}
	// The refused requests left the session as it was; once terminated it
	// is not found.
	if resp, body := post(t, urlA, sid, list); resp.StatusCode != http.StatusOK {
		t.Fatalf("session after the refused requests: status %d: %s", resp.StatusCode, body)
	}
	if resp, body := send(t, "DELETE", urlA, sid, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: status %d: %s", resp.StatusCode, body)
	}
	if resp, body := post(t, urlA, sid, list); resp.StatusCode != http.StatusNotFound {
		t.Errorf("terminated session: status %d (%s), want 404", resp.StatusCode, body)
	}
}

// TestMCPTaskInstruction: a ?task= session offers the task's instruction
// as the prompt "task" and the resource arbor://task/instruction, and the
// first tool result still carries it (for clients that read neither).
func TestMCPTaskInstruction(t *testing.T) {
	s := newTaskServer(t, "", transportTasks...)
	ctx := context.Background()
	for _, first := range []string{"prompt", "tool"} {
		t.Run(first+" first", func(t *testing.T) {
			cs := mustConnect(t, "http://"+s.addr+agent.MCPPath+"?task=mcp-a", "")
			if first == "tool" {
				if r := bash(t, cs, "true"); r.ExitCode != 0 {
					t.Fatalf("bash: %+v", r)
				}
			}
			ps, err := cs.ListPrompts(ctx, nil)
			if err != nil || len(ps.Prompts) != 1 || ps.Prompts[0].Name != "task" {
				t.Fatalf("prompts/list: %v, %+v", err, ps)
			}
			p, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "task"})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Messages) != 1 || p.Messages[0].Role != "user" || p.Messages[0].Content.(*mcp.TextContent).Text != instructionA {
				t.Errorf("prompt task: %+v", p.Messages)
			}
			rs, err := cs.ListResources(ctx, nil)
			if err != nil || len(rs.Resources) != 1 || rs.Resources[0].URI != agent.TaskInstructionURI {
				t.Fatalf("resources/list: %v, %+v", err, rs)
			}
			rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: agent.TaskInstructionURI})
			if err != nil {
				t.Fatal(err)
			}
			if len(rr.Contents) != 1 || rr.Contents[0].Text != instructionA || rr.Contents[0].MIMEType != "text/plain" {
				t.Errorf("resource: %+v", rr.Contents)
			}
			// One env per session: reading the instruction started it, or
			// the tool call did; the first tool result names it either way.
			r := call(t, cs, "bash", map[string]any{"cmd": "echo hi"})
			if first == "prompt" && (!strings.Contains(text(r), "[task] "+instructionA) || !strings.Contains(text(r), "[new sandbox ")) {
				t.Errorf("first tool result after the prompt: %q, want the instruction", text(r))
			}
			if first == "tool" && strings.Contains(text(r), "[new sandbox ") {
				t.Errorf("second tool result: %q, want no intro", text(r))
			}
			var ls agent.ListStatesResult
			ok(t, cs, "list_states", nil, &ls)
			if ls.States[0].Command != "(start of task mcp-a)" {
				t.Errorf("list_states: %+v", ls.States)
			}
		})
	}
	// An image's session has no instruction to offer.
	cs := mustConnect(t, "http://"+s.addr+agent.MCPPath+"?image=busybox", "")
	if caps := cs.InitializeResult().Capabilities; caps.Prompts != nil || caps.Resources != nil {
		t.Errorf("an image session advertises prompts %+v, resources %+v", caps.Prompts, caps.Resources)
	}
}

// TestMCPNoListChanged: the tools (and a task's prompt and resource) of a
// session never change, so the server does not advertise listChanged,
// which would promise notifications it never sends.
func TestMCPNoListChanged(t *testing.T) {
	s := newTaskServer(t, "", transportTasks...)
	for _, q := range []string{"?task=mcp-a", "?image=busybox"} {
		caps := mustConnect(t, "http://"+s.addr+agent.MCPPath+q, "").InitializeResult().Capabilities
		if caps.Tools == nil || caps.Tools.ListChanged {
			t.Errorf("%s: tools capability %+v, want one without listChanged", q, caps.Tools)
		}
		if caps.Prompts != nil && caps.Prompts.ListChanged || caps.Resources != nil && caps.Resources.ListChanged {
			t.Errorf("%s: prompts %+v, resources %+v advertise listChanged", q, caps.Prompts, caps.Resources)
		}
	}
}
