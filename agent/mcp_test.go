package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/arbor-env/arbor/agent"
	arbor "github.com/arbor-env/arbor/clients/go"
)

// bearer adds a token to every request.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b != "" {
		r.Header.Set("Authorization", "Bearer "+string(b))
	}
	return http.DefaultTransport.RoundTrip(r)
}

// connect opens an MCP session with the SDK's own client.
func connect(t testing.TB, url, token string) (*mcp.ClientSession, error) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "arbor-test", Version: "0"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer(token)}, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

func mustConnect(t testing.TB, url, token string) *mcp.ClientSession {
	t.Helper()
	cs, err := connect(t, url, token)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	return cs
}

// call calls a tool; a protocol error fails the test, a tool error is
// returned as a result with IsError.
func call(t testing.TB, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): protocol error: %v", name, args, err)
	}
	return r
}

// ok calls a tool and fails the test on a tool error; it decodes the
// structured result into out.
func ok(t testing.TB, cs *mcp.ClientSession, name string, args, out any) string {
	t.Helper()
	r := call(t, cs, name, args)
	if r.IsError {
		t.Fatalf("%s(%v): tool error: %s", name, args, text(r))
	}
	if out != nil {
		b, err := json.Marshal(r.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured result %s: %v", name, b, err)
		}
	}
	return text(r)
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func bash(t testing.TB, cs *mcp.ClientSession, cmd string) agent.BashResult {
	t.Helper()
	var r agent.BashResult
	ok(t, cs, "bash", map[string]any{"cmd": cmd}, &r)
	return r
}

// resetEnv starts a busybox env over protocol v1, as a trainer would.
func resetEnv(t testing.TB, addr, token string) string {
	t.Helper()
	c, err := arbor.Dial(context.Background(), addr, &arbor.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r, err := c.Reset(context.Background(), arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseEnv(context.Background(), r.EnvID) })
	return r.EnvID
}

func TestToolsOverMCP(t *testing.T) {
	s := newServer(t, "")
	env := resetEnv(t, s.addr, "")
	cs := mustConnect(t, "http://"+s.addr+"/v1/mcp/"+env, "")
	ctx := context.Background()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if len(tl.Description) < 80 {
			t.Errorf("tool %s: description too thin for a model: %q", tl.Name, tl.Description)
		}
	}
	slices.Sort(names)
	if want := []string{"bash", "fork_try", "list_states", "read_file", "rollback", "write_file"}; !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	if !strings.Contains(cs.InitializeResult().Instructions, "rollback") {
		t.Errorf("instructions do not mention rollback: %q", cs.InitializeResult().Instructions)
	}

	// bash keeps shell state; write_file and read_file round-trip.
	r1 := bash(t, cs, "mkdir -p /work && cd /work && export GREETING=hi && echo made")
	if r1.ExitCode != 0 || r1.Stdout != "made\n" || r1.Cwd != "/work" || r1.StateID == "" || r1.Turn != 1 {
		t.Fatalf("bash: %+v", r1)
	}
	var w agent.WriteFileResult
	content := "line 1\nit's \\ 100% \"quoted\"\n"
	ok(t, cs, "write_file", map[string]any{"path": "notes.txt", "content": content}, &w)
	if w.Turn != 2 || w.StateID == r1.StateID {
		t.Errorf("write_file made no new state: %+v", w)
	}
	var rd agent.ReadFileResult
	ok(t, cs, "read_file", map[string]any{"path": "/work/notes.txt"}, &rd)
	if rd.Content != content {
		t.Errorf("read_file: %q, want %q", rd.Content, content)
	}
	r2 := bash(t, cs, `echo "$GREETING $(cat notes.txt | wc -l)"; sh -c 'exit 3'`)
	if r2.Stdout != "hi 2\n" || r2.ExitCode != 3 {
		t.Errorf("bash: %+v", r2)
	}
	r3 := bash(t, cs, "rm notes.txt; export GREETING=bye")

	// list_states: every state with the command that made it.
	var ls agent.ListStatesResult
	txt := ok(t, cs, "list_states", map[string]any{}, &ls)
	t.Logf("list_states:\n%s", txt)
	if ls.EnvID != env || ls.Current != r3.StateID || len(ls.States) != 5 {
		t.Fatalf("list_states: %+v", ls)
	}
	for i, want := range []struct {
		turn int
		tool string
	}{{0, ""}, {1, "bash"}, {2, "write_file"}, {4, "bash"}, {5, "bash"}} {
		st := ls.States[i]
		if st.Turn != want.turn || st.Tool != want.tool || !st.Restorable {
			t.Errorf("state %d: %+v, want turn %d tool %q restorable", i, st, want.turn, want.tool)
		}
	}
	if !ls.States[4].Current || ls.States[3].ExitCode != 3 || !strings.Contains(ls.States[3].Command, "exit 3") {
		t.Errorf("list_states rows: %+v", ls.States)
	}

	// rollback to the write_file state: the file and the variable are back.
	var rb agent.RollbackResult
	txt = ok(t, cs, "rollback", map[string]any{"state_id": w.StateID}, &rb)
	t.Logf("rollback: %s", txt)
	if rb.Turn != 2 || rb.Tool != "write_file" || !strings.Contains(rb.Command, "notes.txt") || rb.Undone != 2 || rb.Cwd != "/work" {
		t.Errorf("rollback: %+v", rb)
	}
	if r := bash(t, cs, `cat notes.txt | head -1; echo "$GREETING $PWD"`); r.Stdout != "line 1\nhi /work\n" || r.Turn != 3 {
		t.Errorf("after rollback: %+v", r)
	}
	ok(t, cs, "list_states", map[string]any{"limit": 3}, &ls)
	if len(ls.States) != 3 || ls.Older == 0 || !ls.States[2].Current {
		t.Errorf("list_states after rollback: %+v", ls)
	}
	// The undone states stay restorable: roll forward.
	ok(t, cs, "rollback", map[string]any{"state_id": r3.StateID}, &rb)
	if r := bash(t, cs, `ls; echo "$GREETING"`); r.Stdout != "bye\n" {
		t.Errorf("after rolling forward: %+v", r)
	}

	// fork_try: output and changed files, the env untouched.
	before := bash(t, cs, "echo keep > keep.txt; echo old > edit.txt")
	open := len(engine.Envs())
	var ft agent.ForkTryResult
	txt = ok(t, cs, "fork_try", map[string]any{"cmd": "rm keep.txt; echo new > edit.txt; echo x > added.txt; cd /; export GREETING=fork; echo tried"}, &ft)
	t.Logf("fork_try (%.0f ms: branch %.0f, changes %.0f):\n%s", ft.TotalS*1000, ft.BranchS*1000, ft.ChangesS*1000, txt)
	if ft.Stdout != "tried\n" || ft.ExitCode != 0 || ft.FromState != before.StateID || ft.Cwd != "/" {
		t.Errorf("fork_try: %+v", ft)
	}
	got := map[string]string{}
	for _, c := range ft.Changes {
		got[c.Path] = c.Kind
	}
	for p, k := range map[string]string{"/work/keep.txt": "deleted", "/work/edit.txt": "modified", "/work/added.txt": "added"} {
		if got[p] != k {
			t.Errorf("fork_try changes: %s is %q, want %q (all: %v)", p, got[p], k, ft.Changes)
		}
	}
	if len(got) != 3 {
		t.Errorf("fork_try reports changes the command did not make: %v", ft.Changes)
	}
	after := bash(t, cs, `cat keep.txt edit.txt; ls added.txt 2>&1; echo "$GREETING $PWD"`)
	if after.Stdout != "keep\nold\nls: added.txt: No such file or directory\nbye /work\n" {
		t.Errorf("fork_try touched the env: %q", after.Stdout)
	}
	if got := len(engine.Envs()); got != open {
		t.Errorf("%d envs open after fork_try, want %d (its branch must be closed)", got, open)
	}
	// A file created and deleted within the command is no change.
	ok(t, cs, "fork_try", map[string]any{"cmd": "touch tmp; rm tmp; cat edit.txt"}, &ft)
	if ft.Changes == nil || len(ft.Changes) != 0 {
		t.Errorf("fork_try of a no-op: changes %v (%s)", ft.Changes, ft.ChangesNote)
	}
}

func TestBadArguments(t *testing.T) {
	s := newServer(t, "")
	env := resetEnv(t, s.addr, "")
	cs := mustConnect(t, "http://"+s.addr+"/v1/mcp/"+env, "")
	for _, tt := range []struct {
		name, tool string
		args       any
		want       string
	}{
		{"bash without cmd", "bash", map[string]any{}, "cmd"},
		{"bash cmd of the wrong type", "bash", map[string]any{"cmd": 42}, "cmd"},
		{"bash empty cmd", "bash", map[string]any{"cmd": "  "}, "empty"},
		{"bash negative timeout", "bash", map[string]any{"cmd": "true", "timeout_s": -1}, "timeout"},
		{"bash unknown argument", "bash", map[string]any{"cmd": "true", "sudo": true}, "sudo"},
		{"bash arguments not an object", "bash", []string{"ls"}, "arguments"},
		{"read_file of a missing file", "read_file", map[string]any{"path": "/nope"}, "No such file"},
		{"read_file without path", "read_file", map[string]any{}, "path"},
		{"write_file into a file as dir", "write_file", map[string]any{"path": "/etc/passwd/x", "content": "a"}, "write_file"},
		{"write_file too big for a command", "write_file", map[string]any{"path": "/big", "content": strings.Repeat("\x01", 400<<10)}, "bad argument"},
		{"rollback unknown state", "rollback", map[string]any{"state_id": "s000000000000"}, "not a state of this environment"},
		{"rollback empty state", "rollback", map[string]any{"state_id": ""}, "state_id"},
		{"list_states negative limit", "list_states", map[string]any{"limit": -2}, "limit"},
		{"fork_try without cmd", "fork_try", map[string]any{"timeout_s": 3}, "cmd"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := call(t, cs, tt.tool, tt.args)
			if !r.IsError || !strings.Contains(text(r), tt.want) {
				t.Errorf("IsError %v, text %q; want a tool error mentioning %q", r.IsError, text(r), tt.want)
			}
		})
	}
	// A state of another env is not this env's to restore.
	other := resetEnv(t, s.addr, "")
	ocs := mustConnect(t, "http://"+s.addr+"/v1/mcp/"+other, "")
	os := bash(t, ocs, "echo other > /o")
	if r := call(t, cs, "rollback", map[string]any{"state_id": os.StateID}); !r.IsError {
		t.Errorf("rollback to another env's state: %s", text(r))
	}
	// The session still works after all that.
	if r := bash(t, cs, "echo alive"); r.Stdout != "alive\n" {
		t.Errorf("after bad calls: %+v", r)
	}
	// A session's own env closed under it (by a protocol client, the idle
	// TTL) is not an infrastructure error (the one mapping: unknown_env,
	// neither retryable nor infra).
	gcs := mustConnect(t, "http://"+s.addr+"/v1/mcp?image=busybox", "")
	var gls agent.ListStatesResult
	ok(t, gcs, "list_states", nil, &gls)
	gone := gls.EnvID
	pc, err := arbor.Dial(context.Background(), s.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if err := pc.CloseEnv(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	if r := call(t, gcs, "bash", map[string]any{"cmd": "true"}); !r.IsError || !strings.Contains(text(r), "unknown_env") ||
		strings.Contains(text(r), "infrastructure") || strings.Contains(text(r), "retrying") {
		t.Errorf("bash in an env closed under the session: IsError %v, %q; want unknown_env, not infra, not retryable", r.IsError, text(r))
	}
	// An unknown tool is a protocol error, not a crash.
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sudo", Arguments: map[string]any{}}); err == nil {
		t.Errorf("unknown tool: no error")
	}
}

func TestSessionEnvAndAuth(t *testing.T) {
	s := newServer(t, "sesame")
	base := "http://" + s.addr + "/v1/mcp"
	for _, tt := range []struct {
		name, url, token string
		status           int
	}{
		{"no token", base + "?image=busybox", "", http.StatusUnauthorized},
		{"wrong token", base + "?image=busybox", "open", http.StatusUnauthorized},
		{"neither task nor image", base, "sesame", http.StatusBadRequest},
		{"both task and image", base + "?image=busybox&task=x", "sesame", http.StatusBadRequest},
		{"unknown task", base + "?task=nope", "sesame", http.StatusBadRequest},
		{"unknown env", base + "/e-nope", "sesame", http.StatusNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", tt.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := (&http.Client{Transport: bearer(tt.token)}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.status)
			}
			if _, err := connect(t, tt.url, tt.token); err == nil {
				t.Errorf("the SDK client connected")
			}
		})
	}

	// ?image=: the session starts its own env and closes it when it ends.
	n := len(engine.Envs())
	cs := mustConnect(t, base+"?image=busybox", "sesame")
	r := call(t, cs, "bash", map[string]any{"cmd": "echo $((6*7))"})
	if r.IsError || !strings.Contains(text(r), "42") || !strings.Contains(text(r), "[new sandbox ") {
		t.Fatalf("first call: %s", text(r))
	}
	var ls agent.ListStatesResult
	ok(t, cs, "list_states", nil, &ls)
	if ls.States[0].Command != "(start of image busybox)" || len(engine.Envs()) != n+1 {
		t.Fatalf("list_states: %+v; %d envs, want %d", ls, len(engine.Envs()), n+1)
	}
	if r := call(t, cs, "bash", map[string]any{"cmd": "true"}); strings.Contains(text(r), "[new sandbox ") {
		t.Errorf("second call started another env: %s", text(r))
	}
	cs.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := engine.Env(ls.EnvID); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("env %s still open after its session ended", ls.EnvID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMCPOrigin: the MCP endpoint refuses (403) a request whose Origin is
// another site, or a domain a DNS rebinding pointed at the server, and
// serves one without an Origin or with its own loopback origin (the
// websocket's rule, package server/origin).
func TestMCPOrigin(t *testing.T) {
	s := newServer(t, "")
	base := "http://" + s.addr + "/v1/mcp?image=busybox"
	for _, tt := range []struct {
		name, origin, host string
		status             int
	}{
		{"foreign origin", "https://evil.example", "", http.StatusForbidden},
		{"rebound domain", "http://evil.example:" + strings.Split(s.addr, ":")[1], "evil.example:" + strings.Split(s.addr, ":")[1], http.StatusForbidden},
		{"null origin", "null", "", http.StatusForbidden},
		{"no origin", "", "", http.StatusOK},
		{"own loopback origin", "http://" + s.addr, "", http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", base, strings.NewReader(
				`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tt.origin != "" {
				req.Header.Set("Origin", tt.origin)
			}
			if tt.host != "" {
				req.Host = tt.host
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tt.status)
			}
			if tt.status == http.StatusOK && !strings.Contains(string(body), `"serverInfo"`) {
				t.Errorf("served, but the answer is not initialize's: %s", body)
			}
			if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
				del, _ := http.NewRequest("DELETE", base, nil)
				del.Header.Set("Mcp-Session-Id", sid)
				if r, err := http.DefaultClient.Do(del); err == nil {
					r.Body.Close()
				}
			}
		})
	}
	// The SDK's own client (no Origin) still works end to end.
	cs := mustConnect(t, base, "")
	if r := call(t, cs, "bash", map[string]any{"cmd": "echo ok"}); r.IsError || !strings.Contains(text(r), "ok") {
		t.Errorf("bash over MCP: %s", text(r))
	}
}
