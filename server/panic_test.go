package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
)

// panicHooks are coordinator hooks that panic on demand, in the goroutine
// of the request that made a state: the next StateMade of any env (next),
// or the next of a given env (armed).
type panicHooks struct {
	next  atomic.Bool
	armed sync.Map // env id → struct{}
	hit   atomic.Int64
}

func (*panicHooks) EnvOpened(string) {}
func (*panicHooks) EnvClosed(string) {}
func (h *panicHooks) StateMade(env, _ string) {
	_, armed := h.armed.LoadAndDelete(env)
	if h.next.CompareAndSwap(true, false) || armed {
		h.hit.Add(1)
		panic("test: a handler bug (StateMade hook of env " + env + ")")
	}
}

// TestPanicInHandler: a panic in one request's handler answers that
// request internal (v1 request, step_batch item, OpenEnv message, plain
// HTTP route) and the server goes on serving, on the same connection and
// on a new one. Before, a step_batch item's panic (its own goroutine)
// and an OpenEnv message's (the connection's goroutine) ended the process
// or the connection.
func TestPanicInHandler(t *testing.T) {
	hooks := &panicHooks{}
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError}))
	boom := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("test: a route's bug") })
	_, addr := newServerWith(t, server.Options{Logger: log, Handlers: map[string]http.Handler{"/boom": boom}}, coordinator.Options{Hooks: hooks})
	ctx := context.Background()
	c := dial(t, addr, nil)

	reset := func(t *testing.T, c *arbor.Client) string {
		t.Helper()
		r, err := c.Reset(ctx, arbor.ResetParams{Task: "count"})
		if err != nil {
			t.Fatalf("reset: %v", err)
		}
		return r.EnvID
	}

	t.Run("request", func(t *testing.T) {
		hooks.next.Store(true)
		_, err := c.Reset(ctx, arbor.ResetParams{Task: "count"})
		if !isCode(err, "internal") {
			t.Fatalf("reset whose handler panicked: %v, want internal", err)
		}
		// One log line, with the method and the stack.
		if l := logs.String(); !strings.Contains(l, "panic serving a request") || !strings.Contains(l, "method=reset") ||
			!strings.Contains(l, "panic_test.go") {
			t.Errorf("log after the panic: %s", l)
		}
		env := reset(t, c) // same connection
		sh(t, c, env, "echo 1 > /work/n")
		c2 := dial(t, addr, nil)
		sh(t, c2, reset(t, c2), "true") // new connection
	})

	t.Run("step_batch item", func(t *testing.T) {
		a, b := reset(t, c), reset(t, c)
		hooks.armed.Store(a, struct{}{})
		res, err := c.StepBatch(ctx, []arbor.BatchItem{
			{EnvID: a, Action: arbor.Bash("echo a", 0)},
			{EnvID: b, Action: arbor.Bash("echo b", 0)},
		}, nil)
		if err != nil {
			t.Fatalf("step_batch: %v", err)
		}
		if e := res.Results[0].Error; e == nil || e.Code != "internal" {
			t.Errorf("item of the panicking step: %+v, want error internal", res.Results[0])
		}
		if r := res.Results[1]; r.Error != nil || string(r.Result.Obs.Stdout) != "b\n" {
			t.Errorf("the other item: %+v", r)
		}
		sh(t, c, b, "true")
		c2 := dial(t, addr, nil)
		sh(t, c2, reset(t, c2), "true")
	})

	t.Run("openenv message", func(t *testing.T) {
		base := "http://" + addr + "/openenv/count"
		oc := oeMustDial(t, base, "")
		hooks.next.Store(true)
		oc.fails("reset", nil, "internal")
		oc.ok("reset", nil, "observation") // same connection
		oc.ok("step", bash("echo 1 > /work/n"), "observation")
		oeMustDial(t, base, "").ok("reset", nil, "observation")
	})

	t.Run("http route", func(t *testing.T) {
		resp, err := http.Get("http://" + addr + "/boom")
		if err != nil {
			t.Fatalf("GET /boom: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "internal") {
			t.Errorf("GET /boom: %d %q, want 500", resp.StatusCode, b)
		}
		resp, err = http.Get("http://" + addr + "/livez")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /livez after the panic: %v %v", resp, err)
		}
		resp.Body.Close()
	})

	if n := hooks.hit.Load(); n != 3 {
		t.Errorf("the hooks panicked %d times, want 3", n)
	}
	// The first connection still serves.
	sh(t, c, reset(t, c), "true")
}
