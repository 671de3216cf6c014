// Package ui is Arbor's web view: one page at / (embedded, no build
// step) with the open envs, the lineage tree of a chosen env or task and
// the engine's health, and the JSON it reads under /ui/api/. The page
// updates live from a server-sent event stream (/ui/api/events) fed by
// the changes the coordinator reports (coordinator.Observer). This
// package keeps the view's read models: the feed (feed.go), the turn log
// (notes.go), how envs ended (ends.go), and the lineage trees built from
// them and the coordinator's records (tree.go). Access rules are the
// server's (package server wraps Handler): this package checks none.
//
// Everything a sandbox can influence (commands, their output, file
// names) reaches the page as JSON and is put into the DOM as text
// (textContent), never as markup; the page's Content-Security-Policy
// allows only its own script and style as a second line.
package ui

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/arbor-env/arbor/server/protocol"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/state"
)

//go:embed static
var static embed.FS

// Source is what the view shows: one coordinator's envs, trees, health and
// feed (Local), or a cluster's, merged from its nodes (package router).
type Source interface {
	Envs(ctx context.Context) (EnvsAnswer, error)
	// Tree fails with state.ErrInvalidParams or ErrUnknownEnv
	// (wrapped) for a bad or unknown scope.
	Tree(ctx context.Context, scope TreeScope) (*Tree, error)
	Health(ctx context.Context) (coordinator.Health, error)
	// Subscribe follows the changes until ctx ends or Close; buf is the
	// events it may hold undelivered.
	Subscribe(ctx context.Context, buf int) Feed
}

// Feed is a Source's stream of changes. C closes when the feed ends:
// Dropped says whether it ended because the reader fell behind (or, for
// a cluster, a node's stream ended), after which the page reloads.
type Feed interface {
	C() <-chan Event
	Dropped() bool
	Close()
}

// Options configure a UI. Zero values take the defaults.
type Options struct {
	// Source is what the view shows; nil: Local(Coordinator).
	Source      Source
	Coordinator *coordinator.Coordinator
	// HealthEvery is how often the event stream pushes the engine's
	// health (default 2 s).
	HealthEvery time.Duration
	// Buffer is each event stream's feed buffer (default 256): a browser
	// that falls further behind gets a resync event and reloads.
	Buffer int
	// Diff serves /ui/api/diff?a=STATE&b=STATE, the diff of two states
	// (package server's, on its coordinator's engine); nil: the view has
	// none (a router's), and the path answers 404.
	Diff   http.Handler
	Logger *slog.Logger
}

// UI serves the web view. Make one with New.
type UI struct {
	o    Options
	src  Source
	log  *slog.Logger
	once sync.Once
	done chan struct{} // closed by Close: event streams end
}

// New makes a UI on a Source (or a coordinator).
func New(o Options) (*UI, error) {
	if o.Source == nil {
		if o.Coordinator == nil {
			return nil, errors.New("ui: Options.Source or Options.Coordinator is required")
		}
		o.Source = Local(o.Coordinator)
	}
	if o.HealthEvery <= 0 {
		o.HealthEvery = 2 * time.Second
	}
	if o.Buffer <= 0 {
		o.Buffer = 256
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &UI{o: o, src: o.Source, log: o.Logger, done: make(chan struct{})}, nil
}

// Close ends the event streams (an HTTP server's shutdown waits for
// handlers that never end otherwise).
func (u *UI) Close() { u.once.Do(func() { close(u.done) }) }

// Handler serves / (the page), /ui/ (its script and style) and /ui/api/.
func (u *UI) Handler() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, files, "index.html")
	})
	mux.Handle("GET /ui/", http.StripPrefix("/ui/", http.FileServerFS(files)))
	mux.HandleFunc("GET /ui/api/envs", u.envs)
	mux.HandleFunc("GET /ui/api/tree", u.tree)
	mux.HandleFunc("GET /ui/api/health", u.health)
	mux.HandleFunc("GET /ui/api/events", u.events)
	if u.o.Diff != nil {
		mux.Handle("GET /ui/api/diff", u.o.Diff)
	} else {
		mux.HandleFunc("GET /ui/api/diff", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "this view has no diff of states (a router's: open the node's)", http.StatusNotFound)
		})
	}
	return headers(mux)
}

// headers sets what every answer of the view carries: a policy that runs
// only the page's own script and style, no sniffing, no framing, no
// referrer, no caching of data.
func headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// EnvRow is one open env of the table.
type EnvRow struct {
	ID     string  `json:"id"`
	Task   string  `json:"task,omitempty"`
	Image  string  `json:"image"`
	Origin string  `json:"origin,omitempty"`
	Head   string  `json:"head"`
	Turn   int     `json:"turn"`
	IdleS  float64 `json:"idle_s"`
	// Recovered is the state a restart restored the env at; Lost why it
	// could not be.
	Recovered string    `json:"recovered,omitempty"`
	Lost      string    `json:"lost,omitempty"`
	Last      *TurnNote `json:"last,omitempty"`
	// Node is the cluster node that holds the env (a router's view).
	Node string `json:"node,omitempty"`
}

// EnvsAnswer is /ui/api/envs.
type EnvsAnswer struct {
	Envs  []EnvRow `json:"envs"`
	Tasks []string `json:"tasks"`
	// Unavailable lists the cluster nodes that did not answer (a
	// router's view): their envs are missing from Envs.
	Unavailable []string `json:"unavailable,omitempty"`
}

func (u *UI) envs(w http.ResponseWriter, r *http.Request) {
	out, err := u.src.Envs(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, out)
}

// local is the Source of one coordinator, whose Observer it is: it
// keeps the read models of the coordinator's changes.
type local struct {
	c     *coordinator.Coordinator
	feed  feed  // changes, to subscribers (feed.go)
	notes notes // the turns' commands and outcomes (notes.go)
	ends  ends  // how envs ended (ends.go)
}

// Local is the Source of a single server: its coordinator, whose one
// observer it becomes (coordinator.SetObserver).
func Local(c *coordinator.Coordinator) Source {
	l := &local{c: c}
	c.SetObserver(l)
	return l
}

// Observe keeps what ev says and hands it to the feed's subscribers.
func (l *local) Observe(ev coordinator.Event) {
	if env := l.ends.record(ev); env != "" {
		l.notes.forget(env)
	}
	out := Event{Event: ev}
	if ev.Ran != nil {
		out.Note = l.notes.add(ev)
	}
	l.feed.publish(out)
}

// Close ends the feed's subscriptions (the coordinator closed).
func (l *local) Close() { l.feed.close() }

func (l *local) Envs(ctx context.Context) (EnvsAnswer, error) {
	out := EnvsAnswer{Envs: []EnvRow{}, Tasks: l.c.TaskNames()}
	tasks := map[string]bool{}
	for _, t := range out.Tasks {
		tasks[t] = true
	}
	for _, e := range l.c.Envs(ctx) {
		row := EnvRow{ID: e.Env.ID, Task: e.Task.Name, Image: e.Env.Image, Origin: e.Env.Origin, Head: e.Env.Head(),
			Turn: e.Turn, IdleS: e.Idle.Seconds(), Last: l.notes.latest(e.Env.ID)}
		if e.Recovered != nil {
			row.Recovered = e.Recovered.StateID
		}
		out.Envs = append(out.Envs, row)
		if e.Task.Name != "" && !tasks[e.Task.Name] {
			tasks[e.Task.Name] = true
			out.Tasks = append(out.Tasks, e.Task.Name)
		}
	}
	for _, l := range l.c.Lost(ctx) {
		out.Envs = append(out.Envs, EnvRow{ID: l.ID, Task: l.Task.Name, Image: l.Image, Head: l.Head,
			Lost: protocol.ErrorOf(l.Err).Message})
	}
	sort.Slice(out.Envs, func(i, j int) bool { return out.Envs[i].ID < out.Envs[j].ID })
	sort.Strings(out.Tasks)
	return out, nil
}

func (l *local) Health(context.Context) (coordinator.Health, error) { return l.c.Health() }

func (l *local) Subscribe(ctx context.Context, buf int) Feed {
	return localFeed{l.feed.subscribe(buf), l.c, ctx}
}

// localFeed passes on the events of the envs the request's tenant sees.
type localFeed struct {
	s   *Subscription
	c   *coordinator.Coordinator
	ctx context.Context
}

func (f localFeed) Visible(ev Event) bool { return f.c.SeesEvent(f.ctx, ev.Event) }

func (f localFeed) C() <-chan Event { return f.s.C }
func (f localFeed) Dropped() bool   { return f.s.Dropped() }
func (f localFeed) Close()          { f.s.Close() }

func (u *UI) tree(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	t, err := u.src.Tree(r.Context(), TreeScope{Env: q.Get("env"), Task: q.Get("task")})
	if err != nil {
		pe := protocol.ErrorOf(err)
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, state.ErrInvalidParams):
			code = http.StatusBadRequest
		case errors.Is(err, state.ErrUnknownEnv):
			code = http.StatusNotFound
		}
		http.Error(w, pe.Message, code)
		return
	}
	writeJSON(w, t)
}

func (u *UI) health(w http.ResponseWriter, r *http.Request) {
	h, err := u.src.Health(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, h)
}

// events streams the coordinator's feed as server-sent events, one per
// change, named by its type, and the engine's health every HealthEvery.
// A browser that falls behind by more than the buffer gets "resync" and
// the stream ends (EventSource reconnects; the page reloads its data).
func (u *UI) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	sub := u.src.Subscribe(r.Context(), u.o.Buffer)
	defer sub.Close()
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(event string, v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			u.log.Warn("ui event", slog.String("event", event), slog.Any("err", err))
			return true
		}
		rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	pushHealth := func() bool {
		h, err := u.src.Health(r.Context())
		if err != nil {
			return true
		}
		return send("health", h)
	}
	if _, err := fmt.Fprint(w, "retry: 2000\n\n"); err != nil {
		return
	}
	if !send("hello", map[string]any{"time": time.Now()}) || !pushHealth() {
		return
	}
	tick := time.NewTicker(u.o.HealthEvery)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-u.done:
			return
		case ev, ok := <-sub.C():
			if !ok {
				if sub.Dropped() {
					send("resync", map[string]any{"why": "fell behind the feed"})
				}
				return
			}
			if v, ok := sub.(interface{ Visible(Event) bool }); ok && !v.Visible(ev) {
				continue // another tenant's env
			}
			if !send(ev.Type, ev) {
				return
			}
		case <-tick.C:
			if !pushHealth() {
				return
			}
		}
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
