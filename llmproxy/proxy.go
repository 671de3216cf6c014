// Package llmproxy is an HTTP reverse proxy in front of the coordinator,
// for agents that are not driven through step: every request an agent
// sends to its LLM through /v1/llm/{env_id}/... marks a turn boundary of
// that environment (coordinator.Boundary: the turn is classified and its
// checkpoint started while the request is forwarded); the response
// (server-sent-event streams included) is held only if the checkpoint is
// not done when the upstream answers (coordinator.WaitTurn).
package llmproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// Prefix is where the proxy is mounted.
const Prefix = "/v1/llm/"

// Response headers the proxy adds.
const (
	HeaderState      = "X-Arbor-State-Id"
	HeaderCheckpoint = "X-Arbor-Checkpoint"
	HeaderExposed    = "X-Arbor-Exposed-Ms"
)

// Options configure the proxy.
type Options struct {
	// Coordinator owns the envs and the turn rule.
	Coordinator *coordinator.Coordinator
	// Upstream is the LLM API's base URL; /v1/llm/{env}/REST goes to
	// Upstream/REST.
	Upstream *url.URL
	Logger   *slog.Logger
}

// Proxy is the handler. Close stops the background work it starts.
type Proxy struct {
	o     Options
	rp    *httputil.ReverseProxy
	stats stats

	// ctx is the background checkpoints' context, cancelled by Close;
	// bg counts them.
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex // guards closed and bg.Add
	closed bool
	bg     sync.WaitGroup
}

type stats struct {
	turns, exposedNanos, overheadNanos, failures atomic.Int64
}

// Stats are the proxy's totals.
type Stats struct {
	Turns    int64
	Exposed  time.Duration // time responses were held for checkpoints
	Overhead time.Duration // time spent before forwarding (classification hand-off)
	Failures int64         // turns whose classification or checkpoint failed
}

// New returns the proxy handler.
func New(o Options) (*Proxy, error) {
	if o.Coordinator == nil || o.Upstream == nil {
		return nil, errors.New("llm proxy needs a coordinator and an upstream URL")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	p := &Proxy{o: o}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(o.Upstream)
			r.Out.Host = o.Upstream.Host
		},
		// Stream server-sent events as they come once released.
		FlushInterval:  -1,
		ModifyResponse: p.hold,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadGateway, "upstream", err.Error())
		},
	}
	return p, nil
}

// Close refuses new requests, cancels the turn checkpoints still being
// classified or queued, and waits for them (or for ctx). Responses held
// for a cancelled checkpoint go through with the failure in
// X-Arbor-Checkpoint.
func (p *Proxy) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	done := make(chan struct{})
	go func() {
		p.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close llm proxy: %w", ctx.Err())
	}
}

// Stats returns the proxy's totals.
func (p *Proxy) Stats() Stats {
	return Stats{Turns: p.stats.turns.Load(), Exposed: time.Duration(p.stats.exposedNanos.Load()),
		Overhead: time.Duration(p.stats.overheadNanos.Load()), Failures: p.stats.failures.Load()}
}

type boundaryKey struct{}

// boundary is one turn boundary's checkpoint, running in the background.
type boundary struct {
	envID string
	// wait and release are the env's ticket: the boundary is ordered with
	// the other operations on the env.
	wait, release func()
	done          chan struct{}
	sid           string
	kind          state.Kind
	err           error
}

// ServeHTTP forwards /v1/llm/{env_id}/rest to the upstream.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rest, ok := strings.CutPrefix(r.URL.Path, Prefix)
	envID, tail, _ := strings.Cut(rest, "/")
	if !ok || envID == "" {
		writeError(w, http.StatusNotFound, "bad_path", "use "+Prefix+"{env_id}/...")
		return
	}
	c := p.o.Coordinator
	err := c.OwnEnv(r.Context(), envID) // another tenant's env: as unknown
	if err == nil {
		_, err = c.Env(envID)
	}
	if err != nil {
		writeError(w, http.StatusNotFound, protocol.ErrorOf(err).Code, err.Error())
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "closed", "the llm proxy is shutting down")
		return
	}
	p.bg.Add(1)
	p.mu.Unlock()
	b := &boundary{envID: envID, done: make(chan struct{})}
	b.wait, b.release = c.Ticket(envID)
	go p.checkpoint(b)
	out := r.Clone(context.WithValue(r.Context(), boundaryKey{}, b))
	out.URL.Path = "/" + tail
	out.URL.RawPath = ""
	p.stats.overheadNanos.Add(int64(time.Since(start)))
	p.rp.ServeHTTP(w, out)
}

// checkpoint ends the turn (coordinator.Boundary). It does not depend on
// the request: a client that goes away still leaves a consistent
// checkpoint behind. It lives until Close at most.
func (p *Proxy) checkpoint(b *boundary) {
	defer p.bg.Done()
	defer close(b.done)
	b.wait()
	defer b.release()
	r, err := p.o.Coordinator.Boundary(p.ctx, b.envID)
	if err != nil {
		b.err = err
		return
	}
	b.sid, b.kind = r.StateID, state.Kind(r.Kind)
	// Wait for the checkpoint under the ticket: its failure is taken from
	// the engine before the next operation on the env may take it.
	b.err = p.o.Coordinator.WaitTurn(p.ctx, b.envID)
}

// hold runs when the upstream's response headers have arrived: it waits
// for the turn's checkpoint, then lets the response through.
func (p *Proxy) hold(resp *http.Response) error {
	b, _ := resp.Request.Context().Value(boundaryKey{}).(*boundary)
	if b == nil {
		return nil
	}
	start := time.Now()
	ctx := resp.Request.Context()
	select {
	case <-b.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	held := time.Since(start)
	p.stats.turns.Add(1)
	p.stats.exposedNanos.Add(int64(held))
	resp.Header.Set(HeaderExposed, strconv.FormatFloat(float64(held.Microseconds())/1000, 'f', 3, 64))
	if b.err != nil {
		// The LLM's answer still goes through; the failure is said in a
		// header and logged, never hidden.
		p.stats.failures.Add(1)
		p.o.Logger.Error("turn checkpoint failed", slog.String("env", b.envID), slog.Any("err", b.err))
		resp.Header.Set(HeaderCheckpoint, "failed: "+protocol.ErrorOf(b.err).Code+": "+b.err.Error())
		return nil
	}
	resp.Header.Set(HeaderState, b.sid)
	resp.Header.Set(HeaderCheckpoint, string(b.kind))
	return nil
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": msg}})
}

// String describes the proxy for logs.
func (p *Proxy) String() string { return fmt.Sprintf("llm proxy to %s", p.o.Upstream) }
