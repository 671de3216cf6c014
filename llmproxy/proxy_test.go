package llmproxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/llmproxy"
	"github.com/arbor-env/arbor/sandbox"
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

func engine(tb testing.TB) (*branch.Engine, *branch.Env) {
	tb.Helper()
	e := branchtest.ForTest(tb, branchtest.Options{Inspector: true}).Engine
	env, _, err := e.NewEnv(context.Background(), "busybox")
	if err != nil {
		tb.Fatal(err)
	}
	return e, env
}

func TestProxyCheckpointsEachTurn(t *testing.T) {
	e, env := engine(t)
	next := make(chan struct{})
	p, err := llmproxy.New(llmproxy.Options{Engine: e, Upstream: upstream(t, next)})
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
	e, env := engine(b)
	up := upstream(b, nil)
	p, err := llmproxy.New(llmproxy.Options{Engine: e, Upstream: up})
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
