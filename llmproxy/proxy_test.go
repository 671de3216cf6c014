package llmproxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/llmproxy"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// upstream is a fake LLM API on loopback: /chat answers JSON, /stream
// answers two server-sent events, the second only once next is closed (or
// right away when next is nil), so a test can see the first one arrive
// while the upstream still holds the second.
func upstream(tb testing.TB, next <-chan struct{}) *url.URL {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/chat":
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"echo":%q,"auth":%q}`, body, r.Header.Get("Authorization"))
		case "/v1/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			if next != nil {
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
			}
			fmt.Fprint(w, "data: two\n\n")
		default:
			http.NotFound(w, r)
		}
	}))
	tb.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u
}

// engine is a coordinator on a real engine (eBPF inspector) and an env it
// handed out.
func engine(tb testing.TB) (*branch.Engine, *coordinator.Coordinator, *branch.Env) {
	tb.Helper()
	e := branchtest.ForTest(tb, branchtest.Options{Inspector: true}).Engine
	c, err := coordinator.New(coordinator.Options{Engine: e, Logger: branchtest.Logger()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	r, err := c.Reset(context.Background(), coordinator.ResetRequest{Image: "busybox"})
	if err != nil {
		tb.Fatal(err)
	}
	return e, c, r.Env
}

func TestProxyCheckpointsEachTurn(t *testing.T) {
	e, c, env := engine(t)
	next := make(chan struct{})
	p, err := llmproxy.New(llmproxy.Options{Coordinator: c, Upstream: upstream(t, next)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	ctx := context.Background()

	// The agent changes a file, then asks its LLM: that request is the
	// turn boundary.
	if _, err := e.Exec(ctx, env, "echo edited > /work/f", sandbox.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", srv.URL+"/v1/llm/"+env.ID+"/v1/chat", strings.NewReader("hello"))
	req.Header.Set("Authorization", "Bearer upstream-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != `{"echo":"hello","auth":"Bearer upstream-key"}` {
		t.Fatalf("forwarded response: %d %s", resp.StatusCode, body)
	}
	sid, kind := resp.Header.Get(llmproxy.HeaderState), resp.Header.Get(llmproxy.HeaderCheckpoint)
	if kind != "fs" && kind != "full" {
		t.Errorf("turn that edited a file checkpointed as %q", kind)
	}
	// The response was held until the checkpoint was committed: the
	// state restores right away and has the edit.
	res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatalf("branch of the proxy's state %s: %v %v", sid, err, res.Errors)
	}
	r, err := e.Exec(ctx, res.Children[0], "cat /work/f", sandbox.ExecOptions{})
	if err != nil || string(r.Stdout) != "edited\n" {
		t.Errorf("state %s: %q %v", sid, r.Stdout, err)
	}

	// A turn that changed nothing keeps the state id; an SSE stream passes
	// through event by event.
	// The deadline only keeps a proxy that holds the stream back from
	// hanging the test: it fails instead.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sreq, _ := http.NewRequestWithContext(sctx, "GET", srv.URL+"/v1/llm/"+env.ID+"/v1/stream", nil)
	resp, err = http.DefaultClient.Do(sreq)
	if err != nil {
		t.Fatalf("stream request (the upstream holds its second event until the first arrived): %v", err)
	}
	defer resp.Body.Close()
	if got := resp.Header.Get(llmproxy.HeaderCheckpoint); got != "none" || resp.Header.Get(llmproxy.HeaderState) != sid {
		t.Errorf("idle turn: checkpoint %q state %q, want none and %s", got, resp.Header.Get(llmproxy.HeaderState), sid)
	}
	// Event by event: "one" reaches the client while the upstream still
	// holds "two" back (a proxy that buffered would deliver neither).
	events := make(chan string)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events <- d
			}
		}
	}()
	if got := <-events; got != "one" {
		t.Fatalf("first event %q, want one (the stream ended: %v)", got, sctx.Err())
	}
	close(next)
	if got := <-events; got != "two" {
		t.Errorf("second event %q, want two", got)
	}
	if rest, open := <-events; open {
		t.Errorf("event %q after the last one", rest)
	}

	// Unknown env: a clear 404, nothing forwarded.
	resp, err = http.Get(srv.URL + "/v1/llm/nope/v1/chat")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(body), "unknown_env") {
		t.Errorf("unknown env: %d %s", resp.StatusCode, body)
	}
	st := p.Stats()
	t.Logf("proxy: %d turns, exposed %v, overhead %v", st.Turns, st.Exposed, st.Overhead)
}

// BenchmarkProxyOverhead compares a request through the proxy (a turn
// boundary whose turn changed nothing) with the same request sent
// straight to the upstream.
func BenchmarkProxyOverhead(b *testing.B) {
	_, c, env := engine(b)
	up := upstream(b, nil)
	p, err := llmproxy.New(llmproxy.Options{Coordinator: c, Upstream: up})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	get := func(b *testing.B, u string) {
		resp, err := http.Post(u, "text/plain", strings.NewReader("x"))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get(b, srv.URL+"/v1/llm/"+env.ID+"/v1/chat") // first turn: the initial checkpoint
	b.Run("direct", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			get(b, up.String()+"/v1/chat")
		}
	})
	b.Run("proxy", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			get(b, srv.URL+"/v1/llm/"+env.ID+"/v1/chat")
		}
	})
}

// TestCloseStopsBackgroundWork: a turn's checkpoint that cannot finish
// (the engine's queue is held, so the classification waits for the env's
// previous checkpoint) is cancelled by Close, which returns once it has
// stopped; the response held for it goes through with the failure said,
// and a request after Close is refused.
func TestCloseStopsBackgroundWork(t *testing.T) {
	e, c, env := engine(t)
	p, err := llmproxy.New(llmproxy.Options{Coordinator: c, Upstream: upstream(t, nil), Logger: branchtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	ctx := context.Background()
	if _, err := e.WaitCheckpoint(ctx, env); err != nil {
		t.Fatal(err)
	}
	release := branchtest.HoldQueue(t, e, "busybox")
	defer release()
	if _, err := e.Exec(ctx, env, "echo edited > /work/f", sandbox.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.CheckpointAsync(env, state.Full); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := http.Post(srv.URL+"/v1/llm/"+env.ID+"/v1/chat", "text/plain", strings.NewReader("hi"))
		done <- answer{resp, err}
	}()
	// The turn's classification now waits for the held checkpoint, which
	// that wait raised.
	branchtest.WaitFor(t, "the proxy's turn to wait for the env's checkpoint", func() bool { return branchtest.RaisedWaiting(e) })
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if n := proxyGoroutines(); n != 0 {
		t.Errorf("%d background checkpoint goroutines left after Close", n)
	}
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	a.resp.Body.Close()
	if got := a.resp.Header.Get(llmproxy.HeaderCheckpoint); a.resp.StatusCode != 200 || !strings.Contains(got, "failed") {
		t.Errorf("response held for a cancelled checkpoint: %d, %s %q", a.resp.StatusCode, llmproxy.HeaderCheckpoint, got)
	}
	resp, err := http.Post(srv.URL+"/v1/llm/"+env.ID+"/v1/chat", "text/plain", strings.NewReader("hi"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("request after Close: %d, want 503", resp.StatusCode)
	}
}

// proxyGoroutines counts the goroutines running a turn's background
// checkpoint.
func proxyGoroutines() int {
	var n int
	for range 100 { // one that called Done may still be returning
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		if n = strings.Count(string(buf), "llmproxy.(*Proxy).checkpoint("); n == 0 {
			return 0
		}
		runtime.Gosched()
	}
	return n
}

// TestProxyReportsItsCheckpointFailure: a turn boundary whose checkpoint
// fails says so in its response, even when the agent's next operation on
// the env ran before the upstream answered: the proxy takes the failure
// under the env's ticket, so the next operation cannot take it first
// (that operation still reports it, and its checkpoint is full).
func TestProxyReportsItsCheckpointFailure(t *testing.T) {
	e := branchtest.ForTest(t, branchtest.Options{}).Engine
	// The boundary's checkpoint takes processes; the next step's none.
	var mu sync.Mutex
	kinds := []state.Kind{state.Proc, state.None}
	classify := func(context.Context, *branch.Env, string) (branch.Turn, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(kinds) == 0 {
			return branch.Turn{}, errors.New("no kind left")
		}
		k := kinds[0]
		kinds = kinds[1:]
		return branch.Turn{Kind: k}, nil
	}
	c, err := coordinator.New(coordinator.Options{Engine: e, Classify: classify, Logger: branchtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := context.Background()
	r, err := c.Reset(ctx, coordinator.ResetRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.Env
	if err := c.WaitTurn(ctx, env.ID); err != nil {
		t.Fatal(err)
	}
	// A process holding open a deleted 72 MiB file, over CRIU's ghost
	// limit: the boundary's dump fails.
	if _, err := e.Exec(ctx, env, branchtest.GhostHolder, sandbox.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	answer := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-answer:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "{}")
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	p, err := llmproxy.New(llmproxy.Options{Coordinator: c, Upstream: u})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	before := env.Head()
	type reply struct {
		resp *http.Response
		err  error
	}
	got := make(chan reply, 1)
	go func() {
		resp, err := http.Post(srv.URL+"/v1/llm/"+env.ID+"/v1/chat", "text/plain", strings.NewReader("hi"))
		got <- reply{resp, err}
	}()
	branchtest.WaitFor(t, "the boundary's checkpoint queued", func() bool { return env.Head() != before })
	// The agent's next step, after the boundary in the env's order.
	wait, release := c.Ticket(env.ID)
	wait()
	step, err := c.Turn(ctx, env.ID, coordinator.Action{Tool: "bash", Cmd: "kill $(pidof sleep); wait 2>/dev/null; true"})
	release()
	if err != nil {
		t.Fatal(err)
	}
	close(answer)
	rp := <-got
	if rp.err != nil {
		t.Fatal(rp.err)
	}
	rp.resp.Body.Close()
	if h := rp.resp.Header.Get(llmproxy.HeaderCheckpoint); !strings.HasPrefix(h, "failed: env_error: ") {
		t.Errorf("%s of the boundary whose checkpoint failed: %q, want the failure", llmproxy.HeaderCheckpoint, h)
	}
	if !errors.Is(step.CheckpointError, state.ErrCheckpoint) || step.Kind != state.Full {
		t.Errorf("the step after the failed boundary: error %v, kind %s; want the failure and full", step.CheckpointError, step.Kind)
	}
}
