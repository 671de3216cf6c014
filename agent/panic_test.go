package agent_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/agent"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
)

// panicHooks panic at the next StateMade of an armed env, in the goroutine
// of the tool call that made the state.
type panicHooks struct{ armed sync.Map }

func (*panicHooks) EnvOpened(string) {}
func (*panicHooks) EnvClosed(string) {}
func (h *panicHooks) StateMade(env, _ string) {
	if _, ok := h.armed.LoadAndDelete(env); ok {
		panic("test: a handler bug (StateMade hook of env " + env + ")")
	}
}

// TestToolPanic: a panic in a tool call (which the MCP SDK runs in a
// goroutine of its own, without recover: it ended the process) is that
// call's tool error, an internal one, and the server goes on: the same
// session's next call and a new session work.
func TestToolPanic(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	hooks := &panicHooks{}
	co, err := coordinator.New(coordinator.Options{Engine: engine, Logger: quiet(), Hooks: hooks, Classify: coordinator.Full})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(co.Close)
	tools, err := agent.New(agent.Options{Coordinator: co, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	h := tools.Handler(agent.HandlerOptions{Logger: quiet()})
	s, err := server.New(server.Options{Coordinator: co, Logger: quiet(),
		Handlers: map[string]http.Handler{agent.MCPPath: h, agent.MCPPath + "/": h}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h.Close(ctx)
		s.Shutdown(ctx)
		hs.Close()
	})
	addr := strings.TrimPrefix(hs.URL, "http://")

	env := resetEnv(t, addr, "")
	cs := mustConnect(t, "http://"+addr+"/v1/mcp/"+env, "")
	hooks.armed.Store(env, struct{}{})
	r := call(t, cs, "bash", map[string]any{"cmd": "echo 1 > /tmp/n"})
	if msg := text(r); !r.IsError || !strings.Contains(msg, "internal") || !strings.Contains(msg, "not caused by your command") {
		t.Fatalf("bash whose call panicked: IsError %v %q, want an internal tool error", r.IsError, msg)
	}
	if got := bash(t, cs, "echo ok").Stdout; got != "ok\n" {
		t.Errorf("same session after the panic: %q", got)
	}
	other := mustConnect(t, "http://"+addr+"/v1/mcp/"+resetEnv(t, addr, ""), "")
	if got := bash(t, other, "echo ok").Stdout; got != "ok\n" {
		t.Errorf("new session after the panic: %q", got)
	}
}
