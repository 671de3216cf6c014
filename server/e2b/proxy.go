package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/arbor-env/arbor/internal/tenant"
)

// Placer is what a cluster's router implements for the API to be served
// by proxy (docs/e2b.md, "Through arbor router"): each request goes
// whole to the node that holds its sandbox, and each node answers it as
// its own API does. A node is named by host:port and the token to
// present there ("" for none).
type Placer interface {
	// E2BEnvNode is the node holding env id (an error when none does).
	E2BEnvNode(ctx context.Context, id string) (addr, token string, err error)
	// E2BStateNode is a live node holding state sid.
	E2BStateNode(ctx context.Context, sid string) (addr, token string, err error)
	// E2BPlace is the node a new sandbox of task goes to: the least
	// loaded live node offering that task, or ("") any live node; ok is
	// false when none does. done ends the placement's count.
	E2BPlace(ctx context.Context, task string) (addr, token string, done func(), ok bool)
	// E2BNodes are every live node.
	E2BNodes(ctx context.Context) (addrs, tokens []string)
}

// Proxy serves the API in front of a cluster's nodes.
type Proxy struct {
	p    Placer
	auth tenant.Auth
	log  *slog.Logger
}

// ProxyOptions configure a Proxy.
type ProxyOptions struct {
	Placer Placer
	// Auth is the router's token rule: the API key must pass it before
	// anything is forwarded.
	Auth   tenant.Auth
	Logger *slog.Logger
}

// NewProxy makes the proxy.
func NewProxy(o ProxyOptions) *Proxy {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Proxy{p: o.Placer, auth: o.Auth, log: log}
}

// Routes are the API's patterns (API.Routes') on the proxy.
func (p *Proxy) Routes() map[string]http.Handler {
	r := map[string]http.Handler{}
	for pat := range (&API{}).Routes() {
		r[pat] = p
	}
	return r
}

// ServeHTTP forwards one request: a sandbox's (in the path, or the
// E2b-Sandbox-Id header) to its node; create to the node placed for its
// template; a fork of a state by id to a node holding it; the list to
// every node, merged. A sandbox no node holds goes to any node, which
// answers it as unknown, worded as every node words it.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a := &API{auth: p.auth}
	ctx, ok := a.authorize(w, r)
	if !ok {
		return
	}
	ctx = tenant.WithToken(ctx, token(r))
	path := strings.TrimPrefix(r.URL.Path, "/v2")
	switch {
	case (path == "/sandboxes") && r.Method == http.MethodGet:
		p.list(ctx, w, r)
		return
	case path == "/sandboxes" && r.Method == http.MethodPost, path == "/sandboxes/fork" && r.Method == http.MethodPost:
		p.byBody(ctx, w, r, path == "/sandboxes")
		return
	}
	id := r.Header.Get("E2b-Sandbox-Id")
	if rest, ok := strings.CutPrefix(path, "/sandboxes/"); ok {
		id, _, _ = strings.Cut(rest, "/")
	}
	addr, token, err := p.p.E2BEnvNode(ctx, id)
	if id == "" || err != nil {
		addr, token = p.anyNode(ctx)
	}
	p.forward(w, r, addr, token, nil)
}

// anyNode is a live node ("" when none).
func (p *Proxy) anyNode(ctx context.Context) (addr, token string) {
	addrs, tokens := p.p.E2BNodes(ctx)
	if len(addrs) == 0 {
		return "", ""
	}
	return addrs[0], tokens[0]
}

// byBody forwards create (to the node placed for its template: a task's
// node, else a node holding the state of that id, else any node for an
// image) or a fork of a state by id (to a node holding it).
func (p *Proxy) byBody(ctx context.Context, w http.ResponseWriter, r *http.Request, create bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, fmt.Errorf("read body: %w", err))
		return
	}
	var b struct {
		TemplateID string `json:"templateID"`
		StateID    string `json:"stateID"`
	}
	json.Unmarshal(body, &b)
	addr, token := "", ""
	if create {
		if a, t, done, ok := p.p.E2BPlace(ctx, b.TemplateID); ok && b.TemplateID != "" {
			defer done()
			addr, token = a, t
		} else if a, t, err := p.p.E2BStateNode(ctx, b.TemplateID); err == nil && b.TemplateID != "" {
			addr, token = a, t
		} else if a, t, done, ok := p.p.E2BPlace(ctx, ""); ok {
			defer done()
			addr, token = a, t
		}
	} else if a, t, err := p.p.E2BStateNode(ctx, b.StateID); err == nil && b.StateID != "" {
		addr, token = a, t
	} else {
		addr, token = p.anyNode(ctx)
	}
	p.forward(w, r, addr, token, body)
}

// list answers the sandboxes of every node, merged.
func (p *Proxy) list(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	addrs, tokens := p.p.E2BNodes(ctx)
	out := []json.RawMessage{}
	for i, addr := range addrs {
		u := url.URL{Scheme: "http", Host: addr, Path: r.URL.Path, RawQuery: r.URL.RawQuery}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			writeError(w, err)
			return
		}
		req.Header.Set("X-API-KEY", p.nodeKey(r, tokens[i]))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			p.log.Warn("list the sandboxes of a node", slog.String("node", addr), slog.Any("err", err))
			continue // a node gone meanwhile: its sandboxes are gone with it
		}
		var page []json.RawMessage
		err = json.NewDecoder(res.Body).Decode(&page)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || err != nil {
			p.log.Warn("list the sandboxes of a node", slog.String("node", addr), slog.Int("status", res.StatusCode), slog.Any("err", err))
			continue
		}
		out = append(out, page...)
	}
	writeJSON(w, http.StatusOK, out)
}

// nodeKey is the key to present to a node: its token, or (a router that
// forwards the clients' tokens, token "") the client's own.
func (p *Proxy) nodeKey(r *http.Request, nodeToken string) string {
	if nodeToken != "" {
		return nodeToken
	}
	return token(r)
}

// forward sends r (with body, when it was read already) to the node at
// addr presenting token, and streams the answer back (Connect streams as
// they come). The access token in a node's answers (create, connect,
// fork) is the key the node was shown: it is replaced by the client's.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, addr, nodeToken string, body []byte) {
	if addr == "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"code": http.StatusServiceUnavailable, "message": "no live node in the cluster"})
		return
	}
	key := token(r)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: addr})
			pr.Out.Host = addr
			for _, h := range []string{"X-API-KEY", "X-Access-Token", "Authorization"} {
				pr.Out.Header.Del(h)
			}
			pr.Out.Header.Set("X-API-KEY", p.nodeKey(r, nodeToken))
			if body != nil {
				pr.Out.Body = io.NopCloser(bytes.NewReader(body))
				pr.Out.ContentLength = int64(len(body))
			}
		},
		FlushInterval: -1,
		ModifyResponse: func(res *http.Response) error {
			if !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") || !strings.Contains(r.URL.Path, "sandboxes") {
				return nil
			}
			b, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				return fmt.Errorf("read a node's answer: %w", err)
			}
			b = bytes.ReplaceAll(b, []byte(`"envdAccessToken":`+quoteJSON(p.nodeKey(r, nodeToken))), []byte(`"envdAccessToken":`+quoteJSON(key)))
			res.Body = io.NopCloser(bytes.NewReader(b))
			res.ContentLength = int64(len(b))
			res.Header.Set("Content-Length", fmt.Sprint(len(b)))
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			p.log.Warn("forward an E2B request", slog.String("node", addr), slog.Any("err", err))
			writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": "node " + addr + " unavailable: " + err.Error()})
		},
	}
	// A node answers a command's stream (its start event) before the
	// request's body ended on the router's side: HTTP/1 would cut the
	// body once the answer's headers are flushed, and the copy to the
	// node with it.
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		p.log.Debug("full duplex", slog.Any("err", err))
	}
	rp.ServeHTTP(w, r)
}

func quoteJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
