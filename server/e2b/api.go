package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/state"
)

// EnvdVersion is the in-sandbox daemon version the sandboxes report: the
// SDK gates features on it (0.5.7: octet-stream uploads, stdin close).
const EnvdVersion = "0.5.7"

// StateHeader names the Arbor state id after a command (a trailer of
// process.Process/Start) or an extension call; the SDK ignores it.
const StateHeader = "Arbor-State-Id"

// defaultTimeout is E2B's sandbox timeout when create names none (5 min).
const defaultTimeout = 300 * time.Second

// Options configure the API.
type Options struct {
	Coordinator *coordinator.Coordinator
	// Auth is the server's token rule: the E2B API key (X-API-KEY, or
	// the sandbox's access token X-Access-Token on the envd routes) is
	// an Arbor token, and acts for its tenant.
	Auth   tenant.Auth
	Logger *slog.Logger
}

// API serves the E2B-compatible API. Its records of sandboxes (template,
// metadata, timeout, pause) live here; the envs are the coordinator's.
type API struct {
	c    *coordinator.Coordinator
	auth tenant.Auth
	log  *slog.Logger

	mu      sync.Mutex
	boxes   map[string]*box
	running map[uint32]*command
	nextPID uint32
}

// box is what E2B says of a sandbox that Arbor's env does not.
type box struct {
	template string
	metadata map[string]string
	// envs are create's envVars, set for every command.
	envs    map[string]string
	started time.Time
	end     time.Time
	// paused is the state id pause checkpointed ("" while running).
	paused string
}

// New makes the API.
func New(o Options) *API {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &API{c: o.Coordinator, auth: o.Auth, log: log, boxes: map[string]*box{}, running: map[uint32]*command{}, nextPID: 1000}
}

// Routes are the patterns to mount on the server's mux (all on one
// handler): the REST API and the envd routes, which the SDK reaches at
// E2B_SANDBOX_URL with the E2b-Sandbox-Id header.
func (a *API) Routes() map[string]http.Handler {
	h := a.Handler()
	r := map[string]http.Handler{}
	for _, p := range []string{"/sandboxes", "/sandboxes/", "/v2/sandboxes", "/v2/sandboxes/", "/snapshots", "/snapshots/",
		"/templates", "/templates/", "/v2/templates", "/v2/templates/", "/v3/templates", "/health", "/files",
		"/process.Process/", "/filesystem.Filesystem/"} {
		r[p] = h
	}
	return r
}

// Handler serves every route of the API.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", a.rest(a.create))
	mux.HandleFunc("POST /v2/sandboxes", a.rest(a.create))
	mux.HandleFunc("GET /sandboxes", a.rest(a.list))
	mux.HandleFunc("GET /v2/sandboxes", a.rest(a.list))
	mux.HandleFunc("GET /sandboxes/{id}", a.rest(a.info))
	mux.HandleFunc("DELETE /sandboxes/{id}", a.rest(a.kill))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", a.rest(a.setTimeout))
	mux.HandleFunc("POST /sandboxes/{id}/pause", a.rest(a.pause))
	mux.HandleFunc("POST /sandboxes/{id}/resume", a.rest(a.resume))
	mux.HandleFunc("POST /sandboxes/{id}/connect", a.rest(a.resume))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", a.rest(a.resume))
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", a.rest(a.setTimeout))
	mux.HandleFunc("POST /sandboxes/{id}/fork", a.rest(a.fork))
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", a.rest(a.snapshot))
	// Arbor's extensions (docs/e2b.md, "Beyond E2B").
	mux.HandleFunc("GET /sandboxes/{id}/states", a.rest(a.states))
	mux.HandleFunc("POST /sandboxes/{id}/rollback", a.rest(a.rollback))
	mux.HandleFunc("POST /sandboxes/fork", a.rest(a.forkState))
	// envd's routes.
	mux.Handle("GET /health", a.envdAuth(http.HandlerFunc(a.health)))
	mux.HandleFunc("GET /files", a.envdHTTP(a.readFile))
	mux.HandleFunc("POST /files", a.envdHTTP(a.writeFiles))
	a.rpcRoutes(mux)
	// The rest of E2B's API answers 501, never a look-alike.
	mux.HandleFunc("/", a.rest(func(context.Context, *http.Request) (int, any, error) {
		return 0, nil, ErrNotImplemented
	}))
	return mux
}

// token is the API key a request presents: E2B's X-API-KEY, the
// sandbox access token X-Access-Token, or a bearer token.
func token(r *http.Request) string {
	if k := r.Header.Get("X-API-KEY"); k != "" {
		return k
	}
	if k := r.Header.Get("X-Access-Token"); k != "" {
		return k
	}
	if k, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return k
	}
	return ""
}

// authorize returns r's context acting for the tenant its key names, or
// false after answering 401 (403 for a non-loopback host without a token
// required, as the server's other HTTP endpoints).
func (a *API) authorize(w http.ResponseWriter, r *http.Request) (context.Context, bool) {
	if !a.auth.Required() && !server.IsLoopback(r.Host) {
		writeJSON(w, http.StatusForbidden, map[string]any{"code": http.StatusForbidden, "message": "this server answers loopback host names only (or set a token)"})
		return nil, false
	}
	t, ok := a.auth.Authenticate(token(r))
	if !ok {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": "invalid API key (an Arbor token)"})
		return nil, false
	}
	return tenant.With(r.Context(), t), true
}

// rest serves a REST route: fn answers a status and a JSON body.
func (a *API) rest(fn func(ctx context.Context, r *http.Request) (int, any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, ok := a.authorize(w, r)
		if !ok {
			return
		}
		code, body, err := fn(ctx, r)
		if err != nil {
			a.log.Debug("e2b request failed", slog.String("path", r.URL.Path), slog.Any("err", err))
			writeError(w, err)
			return
		}
		if body == nil {
			w.WriteHeader(code)
			return
		}
		writeJSON(w, code, body)
	}
}

// decode reads r's JSON body into v (an empty body leaves v as it is).
func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return state.Errorf(state.ErrInvalidParams, "body: %v", err)
	}
	return nil
}

// sandbox is E2B's Sandbox answer of create, connect and fork.
type sandbox struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// StateID is Arbor's: the state the sandbox starts from.
	StateID string `json:"arborStateID,omitempty"`
}

// sandboxDetail is E2B's SandboxDetail / ListedSandbox.
type sandboxDetail struct {
	TemplateID  string            `json:"templateID"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

// newSandbox is the answer naming env id, made for ctx's request (the
// access token the envd routes take is the key the request presented).
func (a *API) newSandbox(r *http.Request, id, template, sid string) sandbox {
	return sandbox{TemplateID: template, SandboxID: id, ClientID: "arbor", EnvdVersion: EnvdVersion, EnvdAccessToken: token(r), StateID: sid}
}

type createBody struct {
	TemplateID string            `json:"templateID"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	Timeout    *int              `json:"timeout"`
}

// create makes a sandbox: an episode of the task named by the template,
// else of the image it names.
func (a *API) create(ctx context.Context, r *http.Request) (int, any, error) {
	var b createBody
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	if b.TemplateID == "" {
		return 0, nil, state.Errorf(state.ErrInvalidParams, "templateID: required (an Arbor task or image)")
	}
	for k := range b.EnvVars {
		if !validEnvName(k) {
			return 0, nil, state.Errorf(state.ErrInvalidParams, "envVars: %q is not a variable name", k)
		}
	}
	var id, sid string
	if slices.Contains(a.c.TaskNames(), b.TemplateID) {
		res, err := a.c.Reset(ctx, coordinator.ResetRequest{Task: b.TemplateID})
		if err != nil {
			return 0, nil, fmt.Errorf("create sandbox of task %q: %w", b.TemplateID, err)
		}
		id, sid = res.Env.ID, res.StateID
	} else if br, err := a.c.Branch(ctx, coordinator.BranchRequest{StateID: b.TemplateID, N: 1}); err == nil {
		// A snapshot id (createSnapshot's, or any state id the tenant
		// sees): a branch of it.
		if br.Children[0] == nil {
			return 0, nil, fmt.Errorf("create sandbox of snapshot %s: %w", b.TemplateID, br.Errors[0])
		}
		id, sid = br.Children[0].ID, br.State
	} else if !errors.Is(err, state.ErrUnknownState) {
		return 0, nil, fmt.Errorf("create sandbox of snapshot %s: %w", b.TemplateID, err)
	} else {
		res, err := a.c.Reset(ctx, coordinator.ResetRequest{Image: b.TemplateID})
		if err != nil {
			return 0, nil, fmt.Errorf("create sandbox of template %q (no task, snapshot or image has that name): %w", b.TemplateID, err)
		}
		id, sid = res.Env.ID, res.StateID
	}
	a.record(id, b.TemplateID, b.Metadata, b.EnvVars, b.Timeout)
	return http.StatusCreated, a.newSandbox(r, id, b.TemplateID, sid), nil
}

// snapshot answers createSnapshot: a checkpoint of the sandbox now, whose
// state id is the snapshot's id and name (Sandbox.create of it branches
// it; the sandbox runs on).
func (a *API) snapshot(ctx context.Context, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	if _, err := a.lookup(ctx, id); err != nil {
		return 0, nil, err
	}
	var sid string
	err := a.ticket(id, func() (err error) {
		sid, err = a.c.Checkpoint(ctx, id)
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	return http.StatusCreated, map[string]any{"snapshotID": sid, "names": []string{sid}}, nil
}

// record keeps E2B's facts of a new sandbox.
func (a *API) record(id, template string, metadata, envs map[string]string, timeout *int) {
	now := time.Now().UTC()
	d := defaultTimeout
	if timeout != nil {
		d = time.Duration(*timeout) * time.Second
	}
	a.mu.Lock()
	a.boxes[id] = &box{template: template, metadata: metadata, envs: envs, started: now, end: now.Add(d)}
	a.mu.Unlock()
}

// lookup is the record of sandbox id as ctx's tenant sees it: an env
// handed out to it (one made elsewhere, by protocol v1, gets a record).
// A sandbox past its timeout is killed here, as E2B kills it at its end
// (docs/e2b.md: at its next request, not on a timer).
func (a *API) lookup(ctx context.Context, id string) (box, error) {
	if !a.c.Has(id) || !a.c.Sees(ctx, id) {
		return box{}, fmt.Errorf("%w: %s", ErrUnknownSandbox, id)
	}
	now := time.Now().UTC()
	a.mu.Lock()
	b, ok := a.boxes[id]
	if !ok {
		task, _ := a.c.Task(id)
		b = &box{template: task.Name, started: now, end: now.Add(defaultTimeout)}
		a.boxes[id] = b
	}
	out := *b
	a.mu.Unlock()
	if now.After(out.end) {
		a.expire(ctx, id)
		return box{}, fmt.Errorf("%w: %s (its timeout ended at %s)", ErrUnknownSandbox, id, out.end.Format(time.RFC3339))
	}
	return out, nil
}

// expire kills sandbox id, whose timeout ended.
func (a *API) expire(ctx context.Context, id string) {
	a.cancelAll(id)
	if err := a.ticket(id, func() error { return a.c.CloseEnv(ctx, id) }); err != nil {
		a.log.Warn("kill a sandbox past its timeout", slog.String("sandbox", id), slog.Any("err", err))
	}
	a.mu.Lock()
	delete(a.boxes, id)
	a.mu.Unlock()
}

// update changes sandbox id's record with fn.
func (a *API) update(id string, fn func(*box)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b, ok := a.boxes[id]; ok {
		fn(b)
	}
}

func (a *API) detail(id string, b box) sandboxDetail {
	st := "running"
	if b.paused != "" {
		st = "paused"
	}
	md := b.metadata
	if md == nil {
		md = map[string]string{}
	}
	return sandboxDetail{TemplateID: b.template, SandboxID: id, ClientID: "arbor", StartedAt: b.started, EndAt: b.end,
		CPUCount: 1, MemoryMB: 512, Metadata: md, State: st, EnvdVersion: EnvdVersion}
}

func (a *API) info(ctx context.Context, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	b, err := a.lookup(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, a.detail(id, b), nil
}

// list answers the tenant's sandboxes, filtered by the query's state
// (running, paused) and metadata (k=v&...), in one page.
func (a *API) list(ctx context.Context, r *http.Request) (int, any, error) {
	q := r.URL.Query()
	var states []string
	for _, s := range q["state"] {
		states = append(states, strings.Split(s, ",")...)
	}
	var want map[string][]string
	if m := q.Get("metadata"); m != "" {
		w, err := url.ParseQuery(m)
		if err != nil {
			return 0, nil, state.Errorf(state.ErrInvalidParams, "metadata: %v", err)
		}
		want = w
	}
	out := []sandboxDetail{}
	for _, e := range a.c.Envs(ctx) {
		b, err := a.lookup(ctx, e.Env.ID)
		if err != nil {
			continue // closed meanwhile
		}
		d := a.detail(e.Env.ID, b)
		if len(states) > 0 && !slices.Contains(states, d.State) {
			continue
		}
		match := true
		for k, v := range want {
			if d.Metadata[k] != v[0] {
				match = false
			}
		}
		if match {
			out = append(out, d)
		}
	}
	return http.StatusOK, out, nil
}

// ticket runs fn holding sandbox id's ticket (the coordinator's per-env
// order of operations).
func (a *API) ticket(id string, fn func() error) error {
	wait, release := a.c.Ticket(id)
	wait()
	defer release()
	return fn()
}

func (a *API) kill(ctx context.Context, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	if _, err := a.lookup(ctx, id); err != nil {
		return 0, nil, err
	}
	a.cancelAll(id)
	if err := a.ticket(id, func() error { return a.c.CloseEnv(ctx, id) }); err != nil {
		return 0, nil, fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	a.mu.Lock()
	delete(a.boxes, id)
	a.mu.Unlock()
	return http.StatusNoContent, nil, nil
}

type timeoutBody struct {
	Timeout *int `json:"timeout"`
}

func (a *API) setTimeout(ctx context.Context, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	var b timeoutBody
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	if _, err := a.lookup(ctx, id); err != nil {
		return 0, nil, err
	}
	if b.Timeout != nil {
		a.update(id, func(x *box) { x.end = time.Now().UTC().Add(time.Duration(*b.Timeout) * time.Second) })
	}
	return http.StatusNoContent, nil, nil
}

// pause checkpoints the sandbox and marks it paused: its commands and
// files answer unavailable until connect resumes it; fork forks the
// paused state. (The env stays on the host: docs/e2b.md.)
func (a *API) pause(ctx context.Context, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	b, err := a.lookup(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	if b.paused != "" {
		return http.StatusConflict, map[string]any{"code": http.StatusConflict, "message": "sandbox " + id + " is already paused"}, nil
	}
	var sid string
	err = a.ticket(id, func() (err error) {
		sid, err = a.c.Checkpoint(ctx, id)
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	a.update(id, func(x *box) { x.paused = sid })
	return http.StatusNoContent, nil, nil
}

// resume answers connect: a paused sandbox runs again (at the state it
// paused in: nothing ran since), a running one is answered as it is.
func (a *API) resume(ctx context.Context, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	var b timeoutBody
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	x, err := a.lookup(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	code := http.StatusOK
	a.update(id, func(x *box) {
		if x.paused != "" {
			code = http.StatusCreated
		}
		x.paused = ""
		if b.Timeout != nil {
			x.end = time.Now().UTC().Add(time.Duration(*b.Timeout) * time.Second)
		}
	})
	return code, a.newSandbox(r, id, x.template, ""), nil
}

// forkBody is E2B's fork request; StateID is Arbor's extension (fork
// that past state of the sandbox instead of its present).
type forkBody struct {
	Count   int    `json:"count"`
	Timeout *int   `json:"timeout"`
	StateID string `json:"stateID"`
}

// forkResult is one child of a fork: its sandbox or its error.
type forkResult struct {
	Sandbox *sandbox       `json:"sandbox,omitempty"`
	Error   map[string]any `json:"error,omitempty"`
}

// fork answers count children of the sandbox through Arbor's branch: of
// its present state, of the state it paused in, or of a past state the
// body names (stateID, an extension).
func (a *API) fork(ctx context.Context, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	var fb forkBody
	if err := decode(r, &fb); err != nil {
		return 0, nil, err
	}
	b, err := a.lookup(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	if fb.StateID == "" && b.paused != "" {
		fb.StateID = b.paused
	}
	return a.branch(ctx, r, id, b, fb)
}

// forkState is POST /sandboxes/fork {stateID, count}: children of any
// state the tenant sees, named by id alone (an extension).
func (a *API) forkState(ctx context.Context, r *http.Request) (int, any, error) {
	var fb forkBody
	if err := decode(r, &fb); err != nil {
		return 0, nil, err
	}
	if fb.StateID == "" {
		return 0, nil, state.Errorf(state.ErrInvalidParams, "stateID: required")
	}
	return a.branch(ctx, r, "", box{}, fb)
}

// branch makes fb.Count children of env id (its present, or the state
// fb.StateID).
func (a *API) branch(ctx context.Context, r *http.Request, id string, b box, fb forkBody) (int, any, error) {
	if fb.Count == 0 {
		fb.Count = 1
	}
	req := coordinator.BranchRequest{EnvID: id, N: fb.Count}
	if fb.StateID != "" {
		req = coordinator.BranchRequest{StateID: fb.StateID, N: fb.Count}
	}
	var res *coordinator.BranchResult
	do := func() (err error) {
		res, err = a.c.Branch(ctx, req)
		return err
	}
	var err error
	if req.EnvID != "" {
		err = a.ticket(id, do)
	} else {
		err = do()
	}
	if err != nil {
		return 0, nil, fmt.Errorf("fork sandbox %q state %q: %w", id, fb.StateID, err)
	}
	template := b.template
	if template == "" {
		template = res.Task.Name
	}
	out := make([]forkResult, len(res.Children))
	for i, ch := range res.Children {
		if ch == nil {
			e := res.Errors[i]
			code := httpStatus(e)
			out[i] = forkResult{Error: map[string]any{"code": code, "message": e.Error()}}
			continue
		}
		a.record(ch.ID, template, copyMap(b.metadata), copyMap(b.envs), fb.Timeout)
		s := a.newSandbox(r, ch.ID, template, res.State)
		out[i] = forkResult{Sandbox: &s}
	}
	return http.StatusCreated, out, nil
}

func copyMap(m map[string]string) map[string]string { return maps.Clone(m) }

// stateInfo is one state of GET /sandboxes/{id}/states.
type stateInfo struct {
	StateID string    `json:"stateID"`
	Parent  string    `json:"parent,omitempty"`
	Turn    int       `json:"turn"`
	Kind    string    `json:"kind"`
	Created time.Time `json:"created"`
}

// states answers the sandbox's head and its lineage, oldest first (an
// extension: each command made one).
func (a *API) states(ctx context.Context, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	if _, err := a.lookup(ctx, id); err != nil {
		return 0, nil, err
	}
	var head string
	var line []coordinator.StateInfo
	err := a.ticket(id, func() (err error) {
		head, line, _, err = a.c.States(ctx, id)
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("states of sandbox %s: %w", id, err)
	}
	out := struct {
		Head   string      `json:"head"`
		States []stateInfo `json:"states"`
	}{Head: head, States: []stateInfo{}}
	for _, s := range line {
		out.States = append(out.States, stateInfo{StateID: s.ID, Parent: s.Parent, Turn: s.Turn, Kind: string(s.Kind), Created: s.Created})
	}
	return http.StatusOK, out, nil
}

// rollback restores the sandbox to a past state of its own, in place (an
// extension; a turn, as Arbor's rollback tool).
func (a *API) rollback(ctx context.Context, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	var body struct {
		StateID string `json:"stateID"`
	}
	if err := decode(r, &body); err != nil {
		return 0, nil, err
	}
	if body.StateID == "" {
		return 0, nil, state.Errorf(state.ErrInvalidParams, "stateID: required")
	}
	if _, err := a.lookup(ctx, id); err != nil {
		return 0, nil, err
	}
	var res *coordinator.TurnResult
	err := a.ticket(id, func() (err error) {
		res, err = a.c.Turn(ctx, id, coordinator.Action{Tool: state.ToolRollback, StateID: body.StateID})
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("roll back sandbox %s: %w", id, err)
	}
	if res.Rejected != "" {
		return 0, nil, state.Errorf(state.ErrInvalidParams, "rollback to %s: %s", body.StateID, res.Rejected)
	}
	a.update(id, func(x *box) { x.paused = "" })
	return http.StatusOK, map[string]string{"stateID": res.StateID, "restored": res.Restored}, nil
}
