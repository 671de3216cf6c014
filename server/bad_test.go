package server_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/vmihailenco/msgpack/v5"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/server/protocol"
)

// raw is a bare websocket to send arbitrary frames.
type raw struct {
	t  *testing.T
	ws *websocket.Conn
}

func dialRaw(t *testing.T, addr string, h http.Header) *raw {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/v1/ws", h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return &raw{t: t, ws: ws}
}

func (r *raw) send(mt int, b []byte) {
	r.t.Helper()
	if err := r.ws.WriteMessage(mt, b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *raw) req(id uint32, method string, params any) {
	r.t.Helper()
	b, err := protocol.EncodeRequest(id, method, params)
	if err != nil {
		r.t.Fatal(err)
	}
	r.send(websocket.BinaryMessage, b)
}

func (r *raw) recv() protocol.Frame {
	r.t.Helper()
	r.ws.SetReadDeadline(time.Now().Add(60 * time.Second))
	_, b, err := r.ws.ReadMessage()
	if err != nil {
		r.t.Fatalf("connection dropped: %v", err)
	}
	f, err := protocol.DecodeFrame(b)
	if err != nil {
		r.t.Fatal(err)
	}
	return f
}

// errCode is the code of the next frame: a response's error or an error
// notification's.
func (r *raw) errCode(wantID uint32) string {
	r.t.Helper()
	f := r.recv()
	switch f.Type {
	case protocol.Response:
		if f.MsgID != wantID {
			r.t.Errorf("response to msgid %d, want %d", f.MsgID, wantID)
		}
		if f.Error == nil {
			return "ok"
		}
		return f.Error.Code
	case protocol.Notification:
		var e protocol.Error
		msgpack.Unmarshal(f.Params, &e)
		return "notify:" + e.Code
	}
	return "?"
}

func TestBadInputs(t *testing.T) {
	_, addr := newServerWith(t, server.Options{MaxFrameBytes: 64 << 10}, coordinator.Options{MaxEnvs: 300})
	r := dialRaw(t, addr, nil)
	big := map[string]any{"env_id": "x", "action": map[string]any{"tool": "write_file", "path": "p", "content": make([]byte, 100<<10)}}
	tests := []struct {
		name string
		send func()
		id   uint32
		want string
	}{
		{"garbage", func() { r.send(websocket.BinaryMessage, []byte{0xc1, 0x00}) }, 0, "notify:malformed"},
		{"text frame", func() { r.send(websocket.TextMessage, []byte("hello")) }, 0, "notify:malformed"},
		{"not a request", func() { b, _ := msgpack.Marshal([]any{1, 5, nil, nil}); r.send(websocket.BinaryMessage, b) }, 0, "notify:malformed"},
		{"bad params shape", func() { b, _ := msgpack.Marshal([]any{0, 6, "envs", "x"}); r.send(websocket.BinaryMessage, b) }, 6, "malformed"},
		{"unknown method", func() { r.req(7, "frobnicate", nil) }, 7, "unknown_method"},
		{"missing field", func() { r.req(8, "step", map[string]any{}) }, 8, "invalid_params"},
		{"wrong type", func() { r.req(9, "branch", map[string]any{"state_id": 5, "n": "four"}) }, 9, "invalid_params"},
		{"unknown tool", func() { r.req(10, "step", map[string]any{"env_id": "x", "action": map[string]any{"tool": "rm"}}) }, 10, "invalid_params"},
		{"unknown env", func() {
			r.req(11, "step", map[string]any{"env_id": "nope", "action": map[string]any{"tool": "bash", "cmd": "ls"}})
		}, 11, "unknown_env"},
		{"unknown state", func() { r.req(12, "branch", map[string]any{"state_id": "nope", "n": 1}) }, 12, "unknown_state"},
		{"unknown task", func() { r.req(13, "reset", map[string]any{"task": "nope"}) }, 13, "unknown_task"},
		{"reset without image", func() { r.req(14, "reset", map[string]any{}) }, 14, "invalid_params"},
		// The client's mistake, not the server's failure (issue 12: it
		// was internal, infra).
		{"unknown image", func() { r.req(19, "reset", map[string]any{"image": "nope"}) }, 19, "bad_request"},
		{"frame too large", func() { r.req(15, "step", big) }, 15, "too_large"},
		// More children than max_envs can never be made: out of range,
		// not the retryable too_many_envs (it was).
		{"n over max_envs", func() { r.req(16, "branch", map[string]any{"state_id": "s", "n": 1000}) }, 16, "invalid_params"},
		{"bad n", func() { r.req(17, "branch", map[string]any{"state_id": "s", "n": 0}) }, 17, "invalid_params"},
		{"batch item", func() { r.req(18, "step_batch", map[string]any{"items": []any{map[string]any{"env_id": 1}}}) }, 18, "invalid_params"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.send()
			if got := r.errCode(tt.id); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
			// The connection is still up and serving.
			r.req(99, "envs", nil)
			if got := r.errCode(99); got != "ok" {
				t.Errorf("envs after %s: %s", tt.name, got)
			}
		})
	}
}

func TestLimitsAndAuth(t *testing.T) {
	ctx := context.Background()
	t.Run("in flight", func(t *testing.T) {
		_, addr := newServer(t, server.Options{MaxInFlight: 2})
		c := dial(t, addr, nil)
		env, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseEnv(ctx, env.EnvID)
		errs := make(chan error, 4)
		for range 4 {
			go func() {
				_, err := c.Step(ctx, env.EnvID, arbor.Bash("sleep 0.5", 0))
				errs <- err
			}()
		}
		busy := 0
		for range 4 {
			if err := <-errs; err != nil {
				if !strings.Contains(err.Error(), protocol.CodeTooManyReqs) {
					t.Errorf("unexpected error %v", err)
				}
				busy++
			}
		}
		// At most 2 may run at once; a request that arrives while the
		// first admitted ones are still being set up may also be refused
		// on a loaded machine, so 3 is fine too, but not 4.
		if busy < 2 || busy == 4 {
			t.Errorf("%d of 4 refused, want 2 (or 3), never fewer", busy)
		}
	})
	t.Run("token", func(t *testing.T) {
		_, addr := newServer(t, server.Options{Token: "sesame"})
		c := dial(t, addr, nil)
		if _, err := c.Envs(ctx); err == nil || !strings.Contains(err.Error(), "unauthorized") {
			t.Fatalf("envs without a token: %v", err)
		}
		if _, err := c.Hello(ctx, "wrong"); err == nil {
			t.Fatal("hello with a wrong token succeeded")
		}
		if _, err := c.Hello(ctx, "sesame"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Envs(ctx); err != nil {
			t.Fatalf("envs after hello: %v", err)
		}
		h := dial(t, addr, &arbor.Options{Token: "sesame"})
		if _, err := h.Envs(ctx); err != nil {
			t.Fatalf("envs with a bearer header: %v", err)
		}
		if _, err := arbor.Dial(ctx, addr, &arbor.Options{Token: "wrong"}); err == nil {
			t.Fatal("dial with a wrong bearer token succeeded")
		}
		// Browsers' cross-site websockets are refused; same-origin ones
		// (websocket-client's default Origin is the server's own host)
		// are accepted.
		if _, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/v1/ws", http.Header{"Origin": {"http://evil.example"}}); err == nil {
			t.Fatal("cross-origin websocket accepted")
		}
		for _, o := range []string{"http://" + addr, "https://" + addr, "ws://" + addr} {
			ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/v1/ws", http.Header{"Origin": {o}, "Authorization": {"Bearer sesame"}})
			if err != nil {
				t.Fatalf("same-origin websocket (Origin %s) refused: %v", o, err)
			}
			ws.Close()
		}
		_, port, _ := net.SplitHostPort(addr)
		for _, o := range []string{"http://127.0.0.1:1", "http://evil.example:" + port, "file://" + addr, "null"} {
			if _, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/v1/ws", http.Header{"Origin": {o}}); err == nil {
				t.Fatalf("websocket with Origin %s accepted", o)
			}
		}
	})
	t.Run("origin", func(t *testing.T) {
		// Without a token a same-origin websocket is accepted when the
		// host is an address (or localhost), not a domain: a page of a
		// domain that DNS rebinding pointed at the server sends its own
		// domain as both Origin and Host.
		_, addr := newServer(t, server.Options{})
		_, port, _ := net.SplitHostPort(addr)
		dialOrigin := func(host, origin string) error {
			ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/v1/ws", http.Header{"Origin": {origin}, "Host": {host}})
			if err == nil {
				ws.Close()
			}
			return err
		}
		if err := dialOrigin(addr, "http://"+addr); err != nil {
			t.Fatalf("same-origin websocket refused: %v", err)
		}
		if err := dialOrigin("localhost:"+port, "http://localhost:"+port); err != nil {
			t.Fatalf("same-origin websocket on localhost refused: %v", err)
		}
		if err := dialOrigin("rebound.example:"+port, "http://rebound.example:"+port); err == nil {
			t.Fatal("same-origin websocket of a domain accepted without a token (DNS rebinding)")
		}
		if err := dialOrigin(addr, "http://evil.example"); err == nil {
			t.Fatal("cross-origin websocket accepted")
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		s, addr := newServer(t, server.Options{})
		c := dial(t, addr, nil)
		env, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		defer engineClose(env.EnvID)
		step := make(chan error, 1)
		go func() {
			r, err := c.Step(ctx, env.EnvID, arbor.Bash("sleep 0.5; echo done", 0))
			if err == nil && string(r.Obs.Stdout) != "done\n" {
				err = errorString("stdout " + string(r.Obs.Stdout))
			}
			step <- err
		}()
		time.Sleep(100 * time.Millisecond)
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := s.Shutdown(sctx); err != nil {
			t.Fatal(err)
		}
		if err := <-step; err != nil {
			t.Errorf("step running at shutdown: %v", err)
		}
		<-c.Done()
	})
}

type errorString string

func (e errorString) Error() string { return string(e) }

func engineClose(id string) {
	if env, err := engine.Env(id); err == nil {
		engine.CloseEnv(context.Background(), env)
	}
}

// TestDuplicateMsgIDRefused: a second request with the id of one still in
// flight is refused at once (the client could not tell the answers apart);
// the first still gets its answer, and the id is free again after it.
func TestDuplicateMsgIDRefused(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	r := dialRaw(t, addr, nil)
	r.req(1, "reset", map[string]any{"image": "busybox"})
	f := r.recv()
	if f.Error != nil {
		t.Fatalf("reset: %+v", f.Error)
	}
	var reset struct {
		EnvID string `msgpack:"env_id"`
	}
	if err := msgpack.Unmarshal(f.Result, &reset); err != nil || reset.EnvID == "" {
		t.Fatalf("reset result: %v %q", err, reset.EnvID)
	}
	defer engineClose(reset.EnvID)
	r.req(2, "step", map[string]any{"env_id": reset.EnvID, "action": map[string]any{"tool": "bash", "cmd": "sleep 1; echo slept"}})
	r.req(2, "envs", nil)
	first := r.recv()
	if first.MsgID != 2 || first.Error == nil || first.Error.Code != protocol.CodeBadRequest || first.Error.Retryable {
		t.Fatalf("duplicate msgid: got %+v (error %+v), want a bad_request refusal, not retryable", first, first.Error)
	}
	if !strings.Contains(first.Error.Message, "already in flight") {
		t.Errorf("refusal says %q", first.Error.Message)
	}
	step := r.recv()
	if step.MsgID != 2 || step.Error != nil {
		t.Fatalf("the first request's answer: %+v (error %+v)", step, step.Error)
	}
	var res struct {
		Obs struct {
			Stdout []byte `msgpack:"stdout"`
		} `msgpack:"obs"`
	}
	if err := msgpack.Unmarshal(step.Result, &res); err != nil || string(res.Obs.Stdout) != "slept\n" {
		t.Fatalf("step result: %v %q", err, res.Obs.Stdout)
	}
	r.req(2, "envs", nil)
	if got := r.errCode(2); got != "ok" {
		t.Errorf("msgid 2 after its request was answered: %s", got)
	}
}

// resp reads the next frame, which must be the response to wantID.
func (r *raw) resp(wantID uint32) protocol.Frame {
	r.t.Helper()
	f := r.recv()
	if f.Type != protocol.Response || f.MsgID != wantID {
		r.t.Fatalf("got %+v, want the response to %d", f, wantID)
	}
	return f
}

// TestParamsOverTheWire: params decode as docs/protocol.md says whatever
// msgpack types a client picks (bin for strings, any integer kind, a
// float without fraction), unknown fields are ignored, and a bad request
// is refused with every bad field named.
func TestParamsOverTheWire(t *testing.T) {
	_, addr := newServer(t, server.Options{MaxBatch: 2})
	r := dialRaw(t, addr, nil)
	r.req(1, "reset", map[string]any{"image": []byte("busybox"), "seed": 7.0, "options": map[string]any{"x": 1}, "later": true})
	f := r.resp(1)
	if f.Error != nil {
		t.Fatalf("reset: %+v", f.Error)
	}
	var reset protocol.ResetResult
	if err := msgpack.Unmarshal(f.Result, &reset); err != nil || reset.EnvID == "" {
		t.Fatalf("reset result: %v %+v", err, reset)
	}
	defer engineClose(reset.EnvID)
	if reset.Info.Seed == nil || *reset.Info.Seed != 7 {
		t.Errorf("reset info.seed %v, want 7", reset.Info.Seed)
	}
	r.req(2, "step", map[string]any{"env_id": []byte(reset.EnvID), "action": map[string]any{
		"tool": []byte("bash"), "cmd": []byte("echo $ARBOR_SEED; echo 0123456789"), "timeout_s": uint8(30), "max_output": 4.0, "nice": 1}})
	f = r.resp(2)
	if f.Error != nil {
		t.Fatalf("step with bin strings: %+v", f.Error)
	}
	var step protocol.StepResult
	if err := msgpack.Unmarshal(f.Result, &step); err != nil {
		t.Fatal(err)
	}
	if !step.Obs.Truncated || !strings.HasPrefix(string(step.Obs.Stdout), "7") {
		t.Errorf("step: stdout %q truncated %v, want max_output 4 applied to the seed's output", step.Obs.Stdout, step.Obs.Truncated)
	}

	bad := []struct {
		name   string
		method string
		params any
		want   []string // in the message
	}{
		{"every field", "step", map[string]any{"env_id": 1, "action": map[string]any{"tool": "bash", "cmd": 2, "timeout_s": -1}},
			[]string{"env_id: want string, got integer", "action.cmd: want string, got integer"}},
		{"fraction", "branch", map[string]any{"state_id": reset.Info.StateID, "n": 1.5}, []string{"n: want integer, got float 1.5"}},
		{"batch limit", "step_batch", map[string]any{"items": []any{
			map[string]any{"env_id": reset.EnvID, "action": map[string]any{"tool": "bash", "cmd": "true"}},
			map[string]any{"env_id": reset.EnvID, "action": map[string]any{"tool": "bash", "cmd": "true"}},
			map[string]any{"env_id": reset.EnvID, "action": map[string]any{"tool": "bash", "cmd": "true"}},
		}}, []string{"items: 3 items, the limit is 2"}},
	}
	for i, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			id := uint32(10 + i)
			r.req(id, tt.method, tt.params)
			f := r.resp(id)
			if f.Error == nil || f.Error.Code != protocol.CodeInvalidParams {
				t.Fatalf("got %+v, want invalid_params", f.Error)
			}
			for _, w := range tt.want {
				if !strings.Contains(f.Error.Message, w) {
					t.Errorf("message %q does not say %q", f.Error.Message, w)
				}
			}
		})
	}
}
