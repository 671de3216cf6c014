package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/state"
)

// The in-sandbox daemon's API (envd): the Connect services the SDK calls
// for commands (process.Process) and the file system
// (filesystem.Filesystem), and its HTTP routes /health and /files. Every
// request names its sandbox in the E2b-Sandbox-Id header.

// maxOutput caps each of a command's stdout and stderr (E2B keeps all
// of it; Arbor's sandbox clamps the cap to its own ceiling).
const maxOutput = 64 << 20

// maxUpload bounds one upload to /files.
const maxUpload = 256 << 20

// chunk is the most bytes one data event carries.
const chunk = 64 << 10

type sandboxKey struct{}

// envdReq is what envdAuth found of the sandbox a request names.
type envdReq struct {
	id  string
	err error // unknown, another tenant's, or paused
}

// sandboxOf is the sandbox the request names, or why it cannot be used.
func sandboxOf(ctx context.Context) (string, error) {
	r, _ := ctx.Value(sandboxKey{}).(envdReq)
	return r.id, r.err
}

// envdAuth authenticates an envd request and puts the sandbox its
// E2b-Sandbox-Id header names in its context, with the error of using
// it (not one of ctx's tenant's, or paused): the handlers answer that
// error in their own wire (a Connect error, an HTTP status).
func (a *API) envdAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, ok := a.authorize(w, r)
		if !ok {
			return
		}
		id := r.Header.Get("E2b-Sandbox-Id")
		var err error
		if id == "" {
			err = ErrNoSandboxHeader
		} else if b, lerr := a.lookup(ctx, id); lerr != nil {
			err = lerr
		} else if b.paused != "" {
			err = fmt.Errorf("%w: %s (connect resumes it)", ErrPaused, id)
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, sandboxKey{}, envdReq{id: id, err: err})))
	})
}

// envdHTTP serves an envd HTTP route.
func (a *API) envdHTTP(fn func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return a.envdAuth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := sandboxOf(r.Context())
		if err == nil {
			err = fn(w, r)
		}
		if err != nil {
			writeError(w, err)
		}
	})).ServeHTTP
}

// rpcRoutes mounts the Connect services on mux.
func (a *API) rpcRoutes(mux *http.ServeMux) {
	for p, h := range a.rpcHandlers() {
		mux.Handle(p, a.envdAuth(h))
	}
}

// rpcHandlers are the Connect services' handlers by route: the calls
// served, and the services' other calls answered unimplemented.
func (a *API) rpcHandlers() map[string]http.Handler {
	opt := connect.WithHandlerOptions(connect.WithCodec(jsonCodec{}), connect.WithInterceptors(sandboxCheck{}))
	routes := map[string]http.Handler{
		"/process.Process/Start":          connect.NewServerStreamHandler("/process.Process/Start", a.start, opt),
		"/process.Process/List":           connect.NewUnaryHandler("/process.Process/List", a.listProcesses, opt),
		"/process.Process/SendSignal":     connect.NewUnaryHandler("/process.Process/SendSignal", a.sendSignal, opt),
		"/filesystem.Filesystem/Stat":     connect.NewUnaryHandler("/filesystem.Filesystem/Stat", a.stat, opt),
		"/filesystem.Filesystem/ListDir":  connect.NewUnaryHandler("/filesystem.Filesystem/ListDir", a.listDir, opt),
		"/filesystem.Filesystem/MakeDir":  connect.NewUnaryHandler("/filesystem.Filesystem/MakeDir", a.makeDir, opt),
		"/filesystem.Filesystem/Move":     connect.NewUnaryHandler("/filesystem.Filesystem/Move", a.move, opt),
		"/filesystem.Filesystem/Remove":   connect.NewUnaryHandler("/filesystem.Filesystem/Remove", a.remove, opt),
		"/process.Process/":               connect.NewUnaryHandler("/process.Process/", unimplemented, opt),
		"/filesystem.Filesystem/":         connect.NewUnaryHandler("/filesystem.Filesystem/", unimplemented, opt),
		"/process.Process/Connect":        connect.NewServerStreamHandler("/process.Process/Connect", a.connectProcess, opt),
		"/filesystem.Filesystem/WatchDir": connect.NewServerStreamHandler("/filesystem.Filesystem/WatchDir", unimplementedStream, opt),
	}
	return routes
}

// sandboxCheck answers a call on a sandbox envdAuth refused with that
// refusal, as a Connect error.
type sandboxCheck struct{}

func (sandboxCheck) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if _, err := sandboxOf(ctx); err != nil {
			return nil, rpcError(err)
		}
		return next(ctx, req)
	}
}

func (sandboxCheck) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (sandboxCheck) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if _, err := sandboxOf(ctx); err != nil {
			return rpcError(err)
		}
		return next(ctx, conn)
	}
}

// unimplemented answers the calls not served (Update, SendInput,
// StreamInput, CloseStdin, the watchers): Connect's unimplemented.
func unimplemented(_ context.Context, r *connect.Request[anyMessage]) (*connect.Response[emptyResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("%s: %w", r.Spec().Procedure, ErrNotImplemented))
}

func unimplementedStream(_ context.Context, r *connect.Request[anyMessage], _ *connect.ServerStream[startResponse]) error {
	return connect.NewError(connect.CodeUnimplemented, fmt.Errorf("%s: %w", r.Spec().Procedure, ErrNotImplemented))
}

// command is a Start in progress: its pid, what it runs and how to stop
// it (SendSignal).
type command struct {
	sandbox string
	config  processConfig
	cancel  context.CancelFunc
	// done is closed when the turn ended, res and err set before.
	done chan struct{}
	res  *coordinator.TurnResult
	err  error
	// killed: SendSignal (or kill) cancelled the turn.
	killed bool
}

// shellCommand is the command line a Start runs in the sandbox's shell:
// the SDK's `/bin/bash -l -c CMD` runs CMD in a subshell (so its exit,
// cwd and envs stay its own, as in E2B's fresh bash; the image needs no
// bash), any other argv quoted.
func shellCommand(p *processConfig) (string, error) {
	if p == nil || p.Cmd == "" {
		return "", state.Errorf(state.ErrInvalidParams, "process.cmd: required")
	}
	body := ""
	if (p.Cmd == "/bin/bash" || p.Cmd == "bash" || p.Cmd == "/bin/sh" || p.Cmd == "sh") && len(p.Args) >= 2 && p.Args[len(p.Args)-2] == "-c" {
		body = p.Args[len(p.Args)-1]
	} else {
		q := []string{quote(p.Cmd)}
		for _, a := range p.Args {
			q = append(q, quote(a))
		}
		body = strings.Join(q, " ")
	}
	var pre []string
	if p.Cwd != nil && *p.Cwd != "" {
		pre = append(pre, "cd -- "+quote(*p.Cwd))
	}
	for _, k := range slices.Sorted(maps.Keys(p.Envs)) {
		if !validEnvName(k) {
			return "", state.Errorf(state.ErrInvalidParams, "process.envs: %q is not a variable name", k)
		}
		pre = append(pre, "export "+k+"="+quote(p.Envs[k]))
	}
	pre = append(pre, body)
	return "(" + strings.Join(pre, " && ") + "\n)", nil
}

// withEnvs is p with the sandbox's envs under its own.
func withEnvs(p *processConfig, envs map[string]string) *processConfig {
	if p == nil || len(envs) == 0 {
		return p
	}
	q := *p
	q.Envs = copyMap(envs)
	for k, v := range p.Envs {
		q.Envs[k] = v
	}
	return &q
}

func validEnvName(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// quote quotes s for a POSIX shell.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// start runs a command as one turn: the start event at once, then, when
// the turn ends, its output and its end (exit code, and the state id in
// the Arbor-State-Id trailer). The SDK's command timeout (the request's
// deadline) bounds the command; SendSignal stops it.
func (a *API) start(ctx context.Context, req *connect.Request[startRequest], stream *connect.ServerStream[startResponse]) error {
	id, _ := sandboxOf(ctx)
	if len(req.Msg.Pty) > 0 && string(req.Msg.Pty) != "null" {
		return connect.NewError(connect.CodeUnimplemented, fmt.Errorf("pty: %w", ErrNotImplemented))
	}
	b, err := a.lookup(ctx, id)
	if err != nil {
		return rpcError(err)
	}
	p := withEnvs(req.Msg.Process, b.envs)
	cmd, err := shellCommand(p)
	if err != nil {
		return rpcError(err)
	}
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		// A little under the deadline: the turn ends (and is
		// checkpointed) before the stream does.
		timeout = time.Until(dl) - 250*time.Millisecond
		if timeout <= 0 {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("command timeout too short"))
		}
	}
	// The turn outlives a client that goes away (it is checkpointed like
	// any turn); SendSignal or the timeout stop it.
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	c := &command{sandbox: id, config: *p, cancel: cancel, done: make(chan struct{})}
	pid := a.track(c)
	defer a.untrack(pid)
	if err := stream.Send(&startResponse{Event: processEvent{Start: &startEvent{Pid: pid}}}); err != nil {
		return err
	}
	// The turn runs in a goroutine that ends with it (its timeout, or
	// SendSignal's cancel); its result travels in c, published by
	// closing c.done.
	go func() {
		var res *coordinator.TurnResult
		err := a.ticket(id, func() (err error) {
			res, err = a.c.Turn(tctx, id, coordinator.Action{Tool: state.ToolBash, Cmd: cmd, Timeout: timeout, MaxOutput: maxOutput})
			return err
		})
		c.res, c.err, c.killed = res, err, tctx.Err() != nil
		close(c.done)
	}()
	return follow(req.Header(), stream, c, timeout)
}

// connectProcess answers Process.Connect: the stream of a running
// command (selected by pid) from now on: its start event, then, when its
// turn ends, its output and end, as Start's.
func (a *API) connectProcess(ctx context.Context, req *connect.Request[connectRequest], stream *connect.ServerStream[startResponse]) error {
	sel := req.Msg.Process.Pid
	if sel == nil {
		return connect.NewError(connect.CodeUnimplemented, fmt.Errorf("select a process by tag: %w", ErrNotImplemented))
	}
	id, _ := sandboxOf(ctx)
	a.mu.Lock()
	c, ok := a.running[uint32(*sel)]
	a.mu.Unlock()
	if !ok || c.sandbox != id {
		return rpcError(fmt.Errorf("%w: %d", ErrUnknownProcess, *sel))
	}
	if err := stream.Send(&startResponse{Event: processEvent{Start: &startEvent{Pid: uint32(*sel)}}}); err != nil {
		return err
	}
	return follow(req.Header(), stream, c, 0)
}

// follow waits for command c's turn, sending the keepalive events the
// client asks for (Keepalive-Ping-Interval, in seconds) meanwhile (after
// a failed send, a client gone, it only waits: the turn is not the
// client's to stop), then sends its output and its end, and its state
// id as the Arbor-State-Id trailer.
func follow(h http.Header, stream *connect.ServerStream[startResponse], c *command, timeout time.Duration) error {
	var tick <-chan time.Time
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		t := time.NewTicker(time.Duration(n) * time.Second)
		defer t.Stop()
		tick = t.C
	}
wait:
	for {
		select {
		case <-c.done:
			break wait
		case <-tick:
			if stream.Send(&startResponse{Event: processEvent{Keepalive: &keepAlive{}}}) != nil {
				tick = nil
			}
		}
	}
	res, err := c.res, c.err
	if err != nil {
		if c.killed {
			// Killed by SendSignal: as envd, a signalled end.
			msg := "signal: killed"
			return stream.Send(&startResponse{Event: processEvent{End: &endEvent{ExitCode: -1, Exited: false, Status: msg, Error: &msg}}})
		}
		return rpcError(err)
	}
	stream.ResponseTrailer().Set(StateHeader, res.StateID)
	out := res.Result
	for _, d := range []struct {
		b      []byte
		stderr bool
	}{{out.Stdout, false}, {out.Stderr, true}} {
		for b := d.b; len(b) > 0; {
			n := min(len(b), chunk)
			ev := &dataEvent{Stdout: b[:n]}
			if d.stderr {
				ev = &dataEvent{Stderr: b[:n]}
			}
			if err := stream.Send(&startResponse{Event: processEvent{Data: ev}}); err != nil {
				return err
			}
			b = b[n:]
		}
	}
	if out.TimedOut {
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("command timed out after %s (state %s)", timeout.Round(time.Millisecond), res.StateID))
	}
	end := &endEvent{ExitCode: int32(out.ExitCode), Exited: true, Status: "exit status " + strconv.Itoa(out.ExitCode)}
	if out.ExitCode != 0 {
		end.Error = &end.Status
	}
	return stream.Send(&startResponse{Event: processEvent{End: end}})
}

// track records a running command and returns its pid (an id of this
// API's: the command runs in the sandbox's shell, whose pid is Arbor's).
func (a *API) track(c *command) uint32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextPID++
	a.running[a.nextPID] = c
	return a.nextPID
}

func (a *API) untrack(pid uint32) {
	a.mu.Lock()
	delete(a.running, pid)
	a.mu.Unlock()
}

// cancelAll stops the running commands of sandbox id (kill).
func (a *API) cancelAll(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.running {
		if c.sandbox == id {
			c.cancel()
		}
	}
}

func (a *API) listProcesses(ctx context.Context, _ *connect.Request[listRequest]) (*connect.Response[listResponse], error) {
	id, _ := sandboxOf(ctx)
	out := &listResponse{Processes: []processInfo{}}
	a.mu.Lock()
	for pid, c := range a.running {
		if c.sandbox == id {
			out.Processes = append(out.Processes, processInfo{Config: c.config, Pid: pid})
		}
	}
	a.mu.Unlock()
	return connect.NewResponse(out), nil
}

// sendSignal stops a running command (SIGKILL and SIGTERM alike: its
// turn is cancelled, which kills the command).
func (a *API) sendSignal(ctx context.Context, req *connect.Request[sendSignalRequest]) (*connect.Response[sendSignalResponse], error) {
	sel := req.Msg.Process.Pid
	if sel == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("select a process by tag: %w", ErrNotImplemented))
	}
	a.mu.Lock()
	c, ok := a.running[uint32(*sel)]
	a.mu.Unlock()
	if id, _ := sandboxOf(ctx); !ok || c.sandbox != id {
		return nil, rpcError(fmt.Errorf("%w: %d", ErrUnknownProcess, *sel))
	}
	c.cancel()
	return connect.NewResponse(&sendSignalResponse{}), nil
}

// health answers envd's GET /health: 204 while the sandbox runs, 502
// (the SDK's "not running": isRunning answers false) when it is paused,
// killed or not the tenant's.
func (a *API) health(w http.ResponseWriter, r *http.Request) {
	if _, err := sandboxOf(r.Context()); err != nil {
		writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": err.Error()})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fsTurn runs a file system command in the sandbox as a turn (readOnly:
// the caller vouches it changes nothing, so it is not classified) and
// answers its result; a non-zero exit is mapped by failed.
func (a *API) fsTurn(ctx context.Context, cmd string, readOnly bool) (*coordinator.TurnResult, error) {
	id, _ := sandboxOf(ctx)
	var res *coordinator.TurnResult
	err := a.ticket(id, func() (err error) {
		res, err = a.c.Turn(ctx, id, coordinator.Action{Tool: state.ToolBash, Cmd: "(" + cmd + "\n)", MaxOutput: maxOutput, ReadOnly: readOnly})
		return err
	})
	if err != nil {
		return nil, err
	}
	if res.Result.Truncated {
		return nil, state.Errorf(state.ErrTooLarge, "output over %d bytes", maxOutput)
	}
	return res, nil
}

// exitError is the error of a file command's exit: 2 no such file
// (ENOENT), 17 exists, else the command's stderr.
func exitError(res *coordinator.TurnResult, what string) error {
	switch res.Result.ExitCode {
	case 0:
		return nil
	case 2:
		return fmt.Errorf("%s: %w", what, ErrUnknownFile)
	case 17:
		return fmt.Errorf("%s: %w", what, ErrExists)
	}
	return state.Errorf(state.ErrInvalid, "%s: exit %d: %s", what, res.Result.ExitCode, strings.TrimSpace(string(res.Result.Stderr)))
}

// must is a shell test that exits 2 when path does not exist.
func must(p string) string {
	return "{ [ -e " + quote(p) + " ] || [ -L " + quote(p) + " ] || exit 2; } && "
}

// statFormat is stat -c's format of one entry (GNU and busybox): raw
// mode in hex, size, owner, group, mtime, then the name (last: it may
// hold the separator).
const statFormat = "%f|%s|%U|%G|%Y|%n"

// parseStat reads one statFormat line.
func parseStat(line string) (entryInfo, error) {
	f := strings.SplitN(line, "|", 6)
	if len(f) != 6 {
		return entryInfo{}, fmt.Errorf("parse stat line %q", line)
	}
	raw, err := strconv.ParseUint(f[0], 16, 32)
	if err != nil {
		return entryInfo{}, fmt.Errorf("parse stat mode %q: %w", f[0], err)
	}
	size, _ := strconv.ParseInt(f[1], 10, 64)
	mtime, _ := strconv.ParseInt(f[4], 10, 64)
	mode := fs.FileMode(raw & 0o777)
	typ := fileTypeOther
	switch raw & 0o170000 {
	case 0o100000:
		typ = fileTypeFile
	case 0o040000:
		typ, mode = fileTypeDir, mode|fs.ModeDir
	case 0o120000:
		typ, mode = fileTypeSymlink, mode|fs.ModeSymlink
	}
	p := f[5]
	return entryInfo{Name: path.Base(p), Type: typ, Path: p, Size: int64s(size), Mode: uint32(raw & 0o7777), Permissions: mode.String(),
		Owner: f[2], Group: f[3], ModifiedTime: time.Unix(mtime, 0).UTC()}, nil
}

// parseStats reads the lines of stat's output.
func parseStats(out []byte) ([]entryInfo, error) {
	var es []entryInfo
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if l == "" {
			continue
		}
		e, err := parseStat(l)
		if err != nil {
			return nil, err
		}
		es = append(es, e)
	}
	return es, nil
}

// statOf is the entry of path p in the sandbox (a read-only turn).
func (a *API) statOf(ctx context.Context, p, what string) (entryInfo, error) {
	res, err := a.fsTurn(ctx, must(p)+"stat -c '"+statFormat+"' -- "+quote(p), true)
	if err != nil {
		return entryInfo{}, err
	}
	if err := exitError(res, what); err != nil {
		return entryInfo{}, err
	}
	es, err := parseStats(res.Result.Stdout)
	if err != nil || len(es) != 1 {
		return entryInfo{}, state.Errorf(state.ErrInvalid, "%s: unexpected stat output %q", what, res.Result.Stdout)
	}
	return es[0], nil
}

func (a *API) stat(ctx context.Context, req *connect.Request[pathRequest]) (*connect.Response[entryResponse], error) {
	e, err := a.statOf(ctx, req.Msg.Path, "stat "+req.Msg.Path)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&entryResponse{Entry: e}), nil
}

func (a *API) listDir(ctx context.Context, req *connect.Request[listDirRequest]) (*connect.Response[listDirResponse], error) {
	p, depth := req.Msg.Path, max(int(req.Msg.Depth), 1)
	cmd := must(p) + "{ [ -d " + quote(p) + " ] || exit 20; } && find " + quote(p) + " -mindepth 1 -maxdepth " + strconv.Itoa(depth) +
		" -exec stat -c '" + statFormat + "' -- {} +"
	res, err := a.fsTurn(ctx, cmd, true)
	if err != nil {
		return nil, rpcError(err)
	}
	if res.Result.ExitCode == 20 {
		return nil, rpcError(state.Errorf(state.ErrInvalidParams, "list %s: not a directory", p))
	}
	if err := exitError(res, "list "+p); err != nil {
		return nil, rpcError(err)
	}
	es, err := parseStats(res.Result.Stdout)
	if err != nil {
		return nil, rpcError(err)
	}
	if es == nil {
		es = []entryInfo{}
	}
	return connect.NewResponse(&listDirResponse{Entries: es}), nil
}

func (a *API) makeDir(ctx context.Context, req *connect.Request[pathRequest]) (*connect.Response[entryResponse], error) {
	p := req.Msg.Path
	res, err := a.fsTurn(ctx, "{ [ ! -e "+quote(p)+" ] || exit 17; } && mkdir -p -- "+quote(p), false)
	if err != nil {
		return nil, rpcError(err)
	}
	if err := exitError(res, "make dir "+p); err != nil {
		return nil, rpcError(err)
	}
	e, err := a.statOf(ctx, p, "make dir "+p)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&entryResponse{Entry: e}), nil
}

func (a *API) move(ctx context.Context, req *connect.Request[moveRequest]) (*connect.Response[entryResponse], error) {
	src, dst := req.Msg.Source, req.Msg.Destination
	res, err := a.fsTurn(ctx, must(src)+"mkdir -p -- \"$(dirname -- "+quote(dst)+")\" && mv -- "+quote(src)+" "+quote(dst), false)
	if err != nil {
		return nil, rpcError(err)
	}
	if err := exitError(res, "move "+src); err != nil {
		return nil, rpcError(err)
	}
	e, err := a.statOf(ctx, dst, "move "+src)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&entryResponse{Entry: e}), nil
}

func (a *API) remove(ctx context.Context, req *connect.Request[pathRequest]) (*connect.Response[emptyResponse], error) {
	p := req.Msg.Path
	res, err := a.fsTurn(ctx, must(p)+"rm -rf -- "+quote(p), false)
	if err != nil {
		return nil, rpcError(err)
	}
	if err := exitError(res, "remove "+p); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&emptyResponse{}), nil
}

// readFile answers GET /files?path=P: the file's bytes (a read-only
// turn).
func (a *API) readFile(w http.ResponseWriter, r *http.Request) error {
	p := r.URL.Query().Get("path")
	if p == "" {
		return state.Errorf(state.ErrInvalidParams, "path: required")
	}
	res, err := a.fsTurn(r.Context(), must(p)+"{ [ ! -d "+quote(p)+" ] || exit 21; } && cat -- "+quote(p), true)
	if err != nil {
		return err
	}
	if res.Result.ExitCode == 21 {
		return state.Errorf(state.ErrInvalidParams, "read %s: a directory", p)
	}
	if err := exitError(res, "read "+p); err != nil {
		return err
	}
	w.Header().Set(StateHeader, res.StateID)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(res.Result.Stdout)))
	w.WriteHeader(http.StatusOK)
	_, err = w.Write(res.Result.Stdout)
	return err
}

// writeInfo is envd's EntryInfo answer of an upload.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// writeFiles answers POST /files: a multipart form of files (each part's
// file name its path, or the query's path) or one octet-stream body
// (path in the query); each file a turn of write_file.
func (a *API) writeFiles(w http.ResponseWriter, r *http.Request) error {
	qp := r.URL.Query().Get("path")
	if r.Header.Get("Content-Encoding") != "" {
		return fmt.Errorf("Content-Encoding %s: %w", r.Header.Get("Content-Encoding"), ErrNotImplemented)
	}
	body := http.MaxBytesReader(w, r.Body, maxUpload)
	var out []writeInfo
	last := ""
	id, _ := sandboxOf(r.Context())
	write := func(p string, content []byte) error {
		if p == "" {
			return state.Errorf(state.ErrInvalidParams, "path: required (the query's, or the part's file name)")
		}
		sid, err := a.writeFile(r.Context(), id, p, content)
		if err != nil {
			return err
		}
		last = sid
		out = append(out, writeInfo{Name: path.Base(p), Type: "file", Path: p})
		return nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				return state.Errorf(state.ErrInvalidParams, "multipart body: %v", err)
			}
			p := qp
			// The part's file name is the file's path (not its base
			// name, which Part.FileName answers).
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if fn := dp["filename"]; fn != "" && qp == "" {
				p = fn
			}
			content, err := io.ReadAll(part)
			if err != nil {
				return state.Errorf(state.ErrTooLarge, "upload over %d bytes", maxUpload)
			}
			if err := write(p, content); err != nil {
				return err
			}
		}
	} else {
		content, err := io.ReadAll(body)
		if err != nil {
			return state.Errorf(state.ErrTooLarge, "upload over %d bytes", maxUpload)
		}
		if err := write(qp, content); err != nil {
			return err
		}
	}
	w.Header().Set(StateHeader, last)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// commandBudget is the most escaped bytes one write_file turn carries,
// under the sandbox's bound on a command's text (1 MiB).
const commandBudget = 900 << 10

// writeChunks splits content where each piece's write_file command stays
// under commandBudget: a byte costs 1 (printable ASCII, newline, tab) or
// at most 5 (an octal escape), counted conservatively.
func writeChunks(content []byte) [][]byte {
	var out [][]byte
	start, cost := 0, 0
	for i, c := range content {
		n := 5
		if c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
			n = 1
		}
		if cost+n > commandBudget {
			out = append(out, content[start:i])
			start, cost = i, 0
		}
		cost += n
	}
	return append(out, content[start:])
}

// writeFile writes content to p in sandbox id: one write_file turn, or
// for a file over one command's bound, a turn per piece into part files
// and a turn that joins them. It answers the last turn's state.
func (a *API) writeFile(ctx context.Context, id, p string, content []byte) (string, error) {
	pieces := writeChunks(content)
	turn := func(act coordinator.Action) (*coordinator.TurnResult, error) {
		var res *coordinator.TurnResult
		err := a.ticket(id, func() (err error) {
			res, err = a.c.Turn(ctx, id, act)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("write %s: %w", p, err)
		}
		if res.Result.ExitCode != 0 {
			return nil, state.Errorf(state.ErrInvalid, "write %s: exit %d: %s", p, res.Result.ExitCode, strings.TrimSpace(string(res.Result.Stderr)))
		}
		return res, nil
	}
	if len(pieces) == 1 {
		res, err := turn(coordinator.Action{Tool: state.ToolWriteFile, Path: p, Content: content})
		if err != nil {
			return "", err
		}
		return res.StateID, nil
	}
	parts := make([]string, len(pieces))
	for i, piece := range pieces {
		parts[i] = p + ".e2b-part-" + strconv.Itoa(i)
		if _, err := turn(coordinator.Action{Tool: state.ToolWriteFile, Path: parts[i], Content: piece}); err != nil {
			return "", err
		}
	}
	q := make([]string, len(parts))
	for i, part := range parts {
		q[i] = quote(part)
	}
	list := strings.Join(q, " ")
	res, err := turn(coordinator.Action{Tool: state.ToolBash, Cmd: "(cat -- " + list + " > " + quote(p) + "; s=$?; rm -f -- " + list + "; exit $s\n)"})
	if err != nil {
		return "", err
	}
	return res.StateID, nil
}
