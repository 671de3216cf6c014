package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/panics"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server/origin"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// MCPPath is where Handler is mounted: MCPPath + "/{env_id}" attaches to
// an open env, MCPPath + "?task=NAME" or "?image=NAME" starts one per
// session.
const MCPPath = "/v1/mcp"

// TaskInstructionURI is the resource of a ?task= session's instruction
// (also its prompt "task").
const TaskInstructionURI = "arbor://task/instruction"

// HandlerOptions configure the MCP handler. Zero values take the defaults.
type HandlerOptions struct {
	// Token, when set, must be presented as "Authorization: Bearer TOKEN"
	// on every request (as for the websocket).
	Token string
	// Tokens, when set, maps tokens to tenants (server.Options.Tokens):
	// a session acts for the tenant of the token that opened it, attaches
	// only to that tenant's envs, and answers requests with another
	// tenant's token as if it did not exist.
	Tokens *tenant.Tokens
	// AllowedOrigins are the browser origins accepted besides the
	// server's own, as the websocket's (server.Options.AllowedOrigins):
	// a request with any other Origin header is refused (403), as MCP's
	// Streamable HTTP transport requires against DNS rebinding.
	AllowedOrigins []string
	// SessionTimeout closes sessions idle for this long (default 30 min);
	// an env the session started is closed with it.
	SessionTimeout time.Duration
	// Version is reported to clients as the server's version.
	Version string
	Logger  *slog.Logger
}

// Handler serves the agent tools over MCP (streamable HTTP) at MCPPath.
type Handler struct {
	t     *Tools
	o     HandlerOptions
	log   *slog.Logger
	sdk   *mcp.StreamableHTTPHandler
	cache *mcp.SchemaCache

	mu     sync.Mutex
	owned  map[*binding]struct{} // sessions that started their own env
	closed bool
	wg     sync.WaitGroup
}

// Handler returns the MCP handler of the tools.
func (t *Tools) Handler(o HandlerOptions) *Handler {
	if o.SessionTimeout <= 0 {
		o.SessionTimeout = 30 * time.Minute
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.Logger == nil {
		o.Logger = t.log
	}
	h := &Handler{t: t, o: o, log: o.Logger, cache: mcp.NewSchemaCache(), owned: map[*binding]struct{}{}}
	h.sdk = mcp.NewStreamableHTTPHandler(h.server, &mcp.StreamableHTTPOptions{
		SessionTimeout: o.SessionTimeout,
		Logger:         o.Logger,
	})
	return h
}

// target is what a session's tools act on, parsed from its URL.
type target struct {
	envID       string // attach to this env
	task, image string // or start one
}

func (tg target) String() string {
	switch {
	case tg.envID != "":
		return MCPPath + "/" + tg.envID
	case tg.task != "":
		return MCPPath + "?task=" + tg.task
	case tg.image != "":
		return MCPPath + "?image=" + tg.image
	}
	return MCPPath
}

// sessionID makes the Mcp-Session-Id of a new session on tg: random, then
// tg's URL, so that a request can be checked against the target its
// session was made for without a table of sessions (a forged one names a
// session the SDK does not have: 404).
func sessionID(tg target) string {
	return rand.Text() + "." + base64.RawURLEncoding.EncodeToString([]byte(tg.String()))
}

// sessionTarget is the URL a session id of sessionID was made for.
func sessionTarget(sid string) (string, bool) {
	_, enc, ok := strings.Cut(sid, ".")
	if !ok {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	return string(b), err == nil
}

type targetKey struct{}

var imageName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$`)

// ServeHTTP checks the Origin, the token and the URL, then hands the
// request to the SDK's streamable HTTP handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !(origin.Rule{Allowed: h.o.AllowedOrigins, Token: h.auth().Required()}).Check(r) {
		origin.Refuse(w, r)
		return
	}
	who, ok := h.tenant(r.Header)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="arbor"`)
		http.Error(w, "wrong or missing token: send Authorization: Bearer TOKEN", http.StatusUnauthorized)
		return
	}
	ctx := tenant.With(r.Context(), who)
	rest, ok := strings.CutPrefix(r.URL.Path, MCPPath)
	if !ok {
		http.NotFound(w, r)
		return
	}
	rest = strings.Trim(rest, "/")
	sid := r.Header.Get("Mcp-Session-Id")
	var tg target
	switch {
	case strings.Contains(rest, "/"):
		http.NotFound(w, r)
		return
	case rest != "":
		tg.envID = rest
		if !h.t.c.Has(rest) || !h.t.c.Sees(ctx, rest) {
			http.Error(w, fmt.Sprintf("no open env %q (make one with reset, or use %s?task=NAME or ?image=NAME)", rest, MCPPath), http.StatusNotFound)
			return
		}
	default:
		q := r.URL.Query()
		tg.task, tg.image = q.Get("task"), q.Get("image")
		if sid == "" {
			if (tg.task == "") == (tg.image == "") {
				http.Error(w, fmt.Sprintf("%s needs exactly one of ?task=NAME and ?image=NAME (or use %s/ENV_ID for an open env)", MCPPath, MCPPath), http.StatusBadRequest)
				return
			}
			if tg.task != "" && !slices.Contains(h.t.c.TaskNames(), tg.task) {
				http.Error(w, fmt.Sprintf("unknown task %q (tasks: %s)", tg.task, strings.Join(h.t.c.TaskNames(), ", ")), http.StatusBadRequest)
				return
			}
			if tg.image != "" && !imageName.MatchString(tg.image) {
				http.Error(w, fmt.Sprintf("bad image name %q", tg.image), http.StatusBadRequest)
				return
			}
		}
	}
	// A session stays on the env, task or image it was made for.
	if made, ok := sessionTarget(sid); ok && made != tg.String() {
		http.Error(w, fmt.Sprintf("Bad Request: session %s was made on %s, not %s: open a new session for %s", sid, made, tg, tg), http.StatusBadRequest)
		return
	}
	// Without a session id only initialize may be sent (the SDK would
	// start a session for any request and answer it with a JSON-RPC error
	// and 200).
	if sid == "" && r.Method == http.MethodPost {
		body, err := io.ReadAll(io.LimitReader(r.Body, mcp.DefaultMaxRequestBodyBytes+1))
		if err != nil {
			http.Error(w, "Bad Request: read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
		if needsSession(r.Header, body) {
			http.Error(w, "Bad Request: no Mcp-Session-Id header: a session starts with initialize, whose answer carries it", http.StatusBadRequest)
			return
		}
	}
	h.sdk.ServeHTTP(w, r.WithContext(context.WithValue(ctx, targetKey{}, tg)))
}

// needsSession reports whether a POST without a session id is one only a
// session may send: any JSON-RPC message but initialize. Left to the SDK
// are bodies that are no JSON object (it answers them) and the
// session-less requests of protocol versions from 2026-07-28 on
// (server/discover, or a protocol version in the header or _meta), which
// the SDK answers with the versions this server speaks so that the client
// falls back to initialize.
func needsSession(hd http.Header, body []byte) bool {
	var msg struct {
		Method *string         `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil {
		return false
	}
	var params struct {
		Meta map[string]any `json:"_meta"`
	}
	_ = json.Unmarshal(msg.Params, &params) // params of another shape carry no _meta
	switch {
	case msg.Method != nil && (*msg.Method == "initialize" || *msg.Method == "server/discover"):
		return false
	case hd.Get("Mcp-Protocol-Version") >= "2026-07-28":
		return false
	case params.Meta[mcp.MetaKeyProtocolVersion] != nil:
		return false
	}
	return true
}

func (h *Handler) auth() tenant.Auth { return tenant.Auth{Token: h.o.Token, Tokens: h.o.Tokens} }

// tenant is who a request's "Authorization: Bearer TOKEN" acts for.
func (h *Handler) tenant(hd http.Header) (tenant.Tenant, bool) {
	if !h.auth().Required() {
		return tenant.Tenant{}, true
	}
	tok, ok := strings.CutPrefix(hd.Get("Authorization"), "Bearer ")
	if !ok {
		return tenant.Tenant{}, false
	}
	return h.auth().Authenticate(tok)
}

// server makes the MCP server of a new session (the SDK also calls it on
// other requests, only to read protocol versions: it is cheap).
func (h *Handler) server(r *http.Request) *mcp.Server {
	tg, _ := r.Context().Value(targetKey{}).(target)
	b := &binding{h: h, tg: tg, who: tenant.From(r.Context())}
	// The tools, prompts and resources of a session never change: no
	// listChanged (the SDK's default would advertise it).
	caps := &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}, Tools: &mcp.ToolCapabilities{}}
	if tg.task != "" {
		caps.Prompts, caps.Resources = &mcp.PromptCapabilities{}, &mcp.ResourceCapabilities{}
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "arbor", Title: "Arbor sandbox", Version: h.o.Version},
		&mcp.ServerOptions{Instructions: instructions(tg), SchemaCache: h.cache, Logger: h.log, Capabilities: caps,
			GetSessionID: func() string { return sessionID(tg) }})
	if tg.task != "" {
		b.addTask(s)
	}
	addTool(s, b, &mcp.Tool{Name: "bash", Description: descBash, Annotations: &mcp.ToolAnnotations{Title: "Run a shell command"}},
		(*Session).Bash, (*BashResult).text)
	readOnly := &mcp.ToolAnnotations{Title: "Read a file", ReadOnlyHint: true}
	addTool(s, b, &mcp.Tool{Name: "read_file", Description: descReadFile, Annotations: readOnly},
		(*Session).ReadFile, (*ReadFileResult).text)
	addTool(s, b, &mcp.Tool{Name: "write_file", Description: descWriteFile, Annotations: &mcp.ToolAnnotations{Title: "Write a file"}},
		(*Session).WriteFile, (*WriteFileResult).text)
	addTool(s, b, &mcp.Tool{Name: "list_states", Description: descListStates, Annotations: &mcp.ToolAnnotations{Title: "List your states", ReadOnlyHint: true}},
		(*Session).ListStates, (*ListStatesResult).text)
	addTool(s, b, &mcp.Tool{Name: "rollback", Description: descRollback, Annotations: &mcp.ToolAnnotations{Title: "Roll the sandbox back", IdempotentHint: true}},
		(*Session).Rollback, (*RollbackResult).text)
	addTool(s, b, &mcp.Tool{Name: "fork_try", Description: descForkTry, Annotations: &mcp.ToolAnnotations{Title: "Try a command on a throwaway copy", ReadOnlyHint: true}},
		(*Session).ForkTry, (*ForkTryResult).text)
	return s
}

func instructions(tg target) string {
	where := "an Arbor sandbox"
	switch {
	case tg.envID != "":
		where += " (env " + tg.envID + ")"
	case tg.task != "":
		where += " started for task " + tg.task + " (its instruction is the prompt \"task\" and the resource " + TaskInstructionURI + ", and comes with your first tool result)"
	default:
		where += " started from image " + tg.image
	}
	return "These tools act on " + where + `: a Linux shell with its own files and processes.
Every change you make is saved as a state. If you break something, call list_states and rollback to the last good state instead of repairing by hand.
Use fork_try to preview a risky command on a throwaway copy: it never changes your sandbox.`
}

// addTool adds tool t, whose calls run fn on the session with the call's
// arguments. A call's errors become tool errors (IsError) that the
// model reads; a structured result goes with a text one. The SDK runs
// each call in a goroutine of its own, without recover: a panic in the
// call is recovered here, logged, and answered as an internal error.
//
// Every call acts for the session's tenant; a call whose token is another
// tenant's is answered as a call on an env that does not exist.
func addTool[A, R any](s *mcp.Server, b *binding, t *mcp.Tool, fn func(*Session, context.Context, A) (*R, error), text func(*R, A) string) {
	mcp.AddTool(s, t, func(ctx context.Context, req *mcp.CallToolRequest, a A) (*mcp.CallToolResult, R, error) {
		var (
			zero R
			r    *R
			msg  string
		)
		err := panics.Call(b.h.log, func() error {
			if err := b.same(req.Extra); err != nil {
				return err
			}
			ctx := tenant.With(ctx, b.who)
			s, err := b.session(ctx, req.Session)
			if err != nil {
				return err
			}
			if r, err = fn(s, ctx, a); err != nil {
				return err
			}
			msg = b.takeIntro() + text(r, a)
			return nil
		}, slog.String("tool", req.Params.Name))
		if err != nil {
			return nil, zero, toolError(err)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: msg}}}, *r, nil
	})
}

// toolError words an error for the model, from the flags of the one
// error mapping (coordError keeps its *protocol.Error in the chain).
func toolError(err error) error {
	if errors.Is(err, panics.ErrPanic) {
		err = protocol.ErrorOf(err) // internal: the server's failure
	}
	var pe *protocol.Error
	errors.As(err, &pe)
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the call was cancelled: %v", err)
	case pe != nil && pe.Infra && pe.Retryable:
		return fmt.Errorf("arbor infrastructure error, not caused by your command (retrying may help): %v", err)
	case pe != nil && pe.Infra:
		return fmt.Errorf("arbor infrastructure error, not caused by your command: %v", err)
	case pe != nil && pe.Retryable:
		return fmt.Errorf("%v (retrying later may help)", err)
	}
	return err
}

// binding is one MCP session's link to its env.
type binding struct {
	h   *Handler
	tg  target
	who tenant.Tenant // the tenant of the token that opened the session

	mu          sync.Mutex
	s           *Session
	ss          *mcp.ServerSession // set for sessions that own their env
	intro       string             // what the first tool result still owes: the new sandbox and the task's instruction
	instruction string             // the task's, once the env started
}

// takeIntro returns the text owed to the first tool result, once.
func (b *binding) takeIntro() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	in := b.intro
	b.intro = ""
	return in
}

// addTask offers a ?task= session's instruction as the prompt "task" and
// the resource TaskInstructionURI. Reading either starts the session's
// env if no tool call has (the instruction is the episode's, as reset
// made it).
func (b *binding) addTask(s *mcp.Server) {
	desc := "The instruction of task " + b.tg.task + ": what to do in this sandbox."
	s.AddPrompt(&mcp.Prompt{Name: "task", Title: "Task " + b.tg.task, Description: desc},
		func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			in, err := b.taskInstruction(ctx, req.Session, req.Extra)
			if err != nil {
				return nil, err
			}
			return &mcp.GetPromptResult{Description: desc,
				Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: in}}}}, nil
		})
	s.AddResource(&mcp.Resource{URI: TaskInstructionURI, Name: "task-instruction", Title: "Task " + b.tg.task, Description: desc, MIMEType: "text/plain"},
		func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			in, err := b.taskInstruction(ctx, req.Session, req.Extra)
			if err != nil {
				return nil, err
			}
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: TaskInstructionURI, MIMEType: "text/plain", Text: in}}}, nil
		})
}

// taskInstruction is the instruction of the session's task, starting its
// env if needed.
func (b *binding) taskInstruction(ctx context.Context, ss *mcp.ServerSession, extra *mcp.RequestExtra) (in string, err error) {
	err = panics.Call(b.h.log, func() error {
		if err := b.same(extra); err != nil {
			return err
		}
		if _, err := b.session(tenant.With(ctx, b.who), ss); err != nil {
			return err
		}
		b.mu.Lock()
		in = b.instruction
		b.mu.Unlock()
		return nil
	}, slog.String("read", "task instruction"))
	if err != nil {
		return "", toolError(err)
	}
	if in == "" {
		in = "(task " + b.tg.task + " has no instruction)"
	}
	return in, nil
}

// same checks that a request presents a token of the session's tenant.
func (b *binding) same(extra *mcp.RequestExtra) error {
	if !b.h.auth().Required() {
		return nil
	}
	var hd http.Header
	if extra != nil {
		hd = extra.Header
	}
	if who, ok := b.h.tenant(hd); ok && (who.Admin || who == b.who) {
		return nil
	}
	id := b.tg.envID
	b.mu.Lock()
	if b.s != nil {
		id = b.s.id
	}
	b.mu.Unlock()
	return coordError("env "+id, fmt.Errorf("%w: no open env %q", state.ErrUnknownEnv, id))
}

// session returns the session's tools, starting its env on first use when
// the session owns one (then the first tool result owes b.intro).
func (b *binding) session(ctx context.Context, ss *mcp.ServerSession) (_ *Session, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.h.t
	if b.tg.envID != "" {
		if b.s, err = t.Attach(b.tg.envID, ""); err != nil {
			return nil, err
		}
		return b.s, nil
	}
	if b.s != nil {
		if !t.c.Has(b.s.id) {
			return nil, coordError("session", fmt.Errorf("%w: this session's env %s was closed (idle too long?); open a new session",
				state.ErrUnknownEnv, b.s.id))
		}
		return b.s, nil
	}
	if err := b.h.adopt(b); err != nil {
		return nil, err
	}
	res, err := t.c.Reset(ctx, coordinator.ResetRequest{Task: b.tg.task, Image: b.tg.image, Ephemeral: true})
	if err != nil {
		b.h.disown(b)
		return nil, coordError("start env", err)
	}
	what := "image " + res.Env.Image
	if b.tg.task != "" {
		what = "task " + b.tg.task
	}
	if b.s, err = t.Attach(res.Env.ID, "(start of "+what+")"); err != nil {
		b.h.disown(b)
		return nil, err
	}
	b.ss = ss
	b.h.wg.Add(1)
	go b.h.closeWhenDone(b)
	b.instruction = strings.TrimSpace(res.Instruction)
	b.intro = fmt.Sprintf("[new sandbox %s for %s]\n", res.Env.ID, what)
	if b.instruction != "" {
		b.intro += "[task] " + b.instruction + "\n"
	}
	b.intro += "\n"
	t.log.Info("mcp session env", slog.String("env", res.Env.ID), slog.String("task", b.tg.task), slog.String("image", b.tg.image))
	return b.s, nil
}

// adopt records a session that owns its env, unless the handler closed.
func (h *Handler) adopt(b *binding) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return coordError("start env", fmt.Errorf("%w: the server is shutting down", state.ErrShuttingDown))
	}
	h.owned[b] = struct{}{}
	return nil
}

func (h *Handler) disown(b *binding) {
	h.mu.Lock()
	delete(h.owned, b)
	h.mu.Unlock()
}

// closeWhenDone closes a session's own env when the session ends (the
// client deleted it, it idled out, or Close closed it).
func (h *Handler) closeWhenDone(b *binding) {
	defer h.wg.Done()
	b.ss.Wait()
	b.mu.Lock()
	id := b.s.id
	b.mu.Unlock()
	h.disown(b)
	ctx, cancel := context.WithTimeout(tenant.With(context.Background(), b.who), time.Minute)
	defer cancel()
	wait, release := h.t.c.Ticket(id)
	wait()
	err := h.t.c.Discard(ctx, id)
	release()
	if err != nil && !errors.Is(err, state.ErrUnknownEnv) {
		h.log.Warn("close env of ended mcp session", slog.String("env", id), slog.Any("err", err))
	}
	h.t.Forget(id)
	h.log.Info("mcp session ended", slog.String("env", id))
}

// Close ends the sessions that started their own env and closes those
// envs. Sessions attached to other envs are left to the HTTP server's
// shutdown.
func (h *Handler) Close(ctx context.Context) error {
	h.mu.Lock()
	h.closed = true
	owned := make([]*binding, 0, len(h.owned))
	for b := range h.owned {
		owned = append(owned, b)
	}
	h.mu.Unlock()
	// A binding's lock is taken without h.mu (session takes them in the
	// other order).
	for _, b := range owned {
		b.mu.Lock()
		ss := b.ss
		b.mu.Unlock()
		if ss != nil {
			ss.Close()
		}
	}
	done := make(chan struct{})
	go func() { h.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close mcp sessions: %w", ctx.Err())
	}
}
