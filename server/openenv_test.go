package server_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server"
)

// oeClient speaks the OpenEnv endpoint the way OpenEnv's EnvClient
// (src/openenv/core/env_client.py of meta-pytorch/OpenEnv) does: one
// websocket at {base_url}/ws, a JSON text message {"type", "data"} per
// call and one JSON answer read back; an answer of type "error" is a
// failure carrying data.message and data.code.
type oeClient struct {
	t  *testing.T
	ws *websocket.Conn
}

// oeDial connects to base (http://HOST:PORT/openenv/TASK) + "/ws" + query.
func oeDial(t *testing.T, base, query string, h http.Header) (*oeClient, *http.Response, error) {
	t.Helper()
	u := "ws" + strings.TrimPrefix(strings.TrimRight(base, "/"), "http") + "/ws" + query
	ws, resp, err := websocket.DefaultDialer.Dial(u, h)
	if err != nil {
		return nil, resp, err
	}
	t.Cleanup(func() { ws.Close() })
	return &oeClient{t: t, ws: ws}, resp, nil
}

func oeMustDial(t *testing.T, base, query string) *oeClient {
	t.Helper()
	c, _, err := oeDial(t, base, query, nil)
	if err != nil {
		t.Fatalf("dial %s%s: %v", base, query, err)
	}
	return c
}

// oeAnswer is an answer: {"type", "data"}.
type oeAnswer struct {
	Type string         `json:"type"`
	Data map[string]any `json:"data"`
}

// raw sends one text frame and reads one answer.
func (c *oeClient) raw(frame string) oeAnswer {
	c.t.Helper()
	if err := c.ws.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
		c.t.Fatalf("send: %v", err)
	}
	c.ws.SetReadDeadline(time.Now().Add(2 * time.Minute))
	mt, b, err := c.ws.ReadMessage()
	if err != nil {
		c.t.Fatalf("receive after %.80q: %v", frame, err)
	}
	if mt != websocket.TextMessage {
		c.t.Fatalf("answer in a frame of type %d, want text (%d)", mt, websocket.TextMessage)
	}
	var a oeAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		c.t.Fatalf("answer %q is not JSON: %v", b, err)
	}
	return a
}

// send is env_client.py's _send_and_receive: json.dumps(message).
func (c *oeClient) send(typ string, data any) oeAnswer {
	c.t.Helper()
	m := map[string]any{"type": typ}
	if data != nil {
		m["data"] = data
	}
	b, err := json.Marshal(m)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.raw(string(b))
}

// ok sends a message and fails the test on an error answer or an answer
// of another type than want.
func (c *oeClient) ok(typ string, data any, want string) map[string]any {
	c.t.Helper()
	a := c.send(typ, data)
	if a.Type != want {
		c.t.Fatalf("%s %v: answer %s %v, want type %s", typ, data, a.Type, a.Data, want)
	}
	return a.Data
}

// fails sends a message and checks that the answer is an error of code.
func (c *oeClient) fails(typ string, data any, code string) map[string]any {
	c.t.Helper()
	return oeErrorOf(c.t, c.send(typ, data), code)
}

// oeErrorOf checks that a is an error of Arbor's code (arbor_code) with
// a message and one of OpenEnv's codes (code).
func oeErrorOf(t *testing.T, a oeAnswer, code string) map[string]any {
	t.Helper()
	if a.Type != "error" || a.Data["arbor_code"] != code || a.Data["message"] == "" || !oeCodes[fmt.Sprint(a.Data["code"])] {
		t.Fatalf("answer %s %v, want an error of arbor_code %s with a message and an OpenEnv code", a.Type, a.Data, code)
	}
	return a.Data
}

// oeCodes are OpenEnv's error codes (WSErrorCode, env_server/types.py).
var oeCodes = map[string]bool{"INVALID_JSON": true, "UNKNOWN_TYPE": true, "VALIDATION_ERROR": true, "EXECUTION_ERROR": true,
	"CAPACITY_REACHED": true, "FACTORY_ERROR": true, "SESSION_ERROR": true}

// The parts of a StepResult that GenericEnvClient._parse_result reads.
func obsOf(t *testing.T, d map[string]any) (obs, meta map[string]any, reward any, done bool) {
	t.Helper()
	obs, _ = d["observation"].(map[string]any)
	meta, _ = obs["metadata"].(map[string]any)
	if obs == nil || meta == nil {
		t.Fatalf("answer data %v: want observation with metadata", d)
	}
	done, _ = d["done"].(bool)
	return obs, meta, d["reward"], done
}

func bash(cmd string) map[string]any { return map[string]any{"tool": "bash", "cmd": cmd} }

// oeBase makes a server and returns its OpenEnv base URL for the count
// task.
func oeBase(t *testing.T, o server.Options) (string, string) {
	t.Helper()
	_, addr := newServer(t, o)
	return "http://" + addr + "/openenv/count", addr
}

func getJSON(t *testing.T, u string, h http.Header) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(b, &m)
	return resp.StatusCode, m
}

func TestOpenEnvEpisode(t *testing.T) {
	base, addr := oeBase(t, server.Options{})
	if code, m := getJSON(t, base+"/health", nil); code != 200 || m["status"] != "healthy" {
		t.Errorf("/health: %d %v", code, m)
	}
	if code, m := getJSON(t, base+"/schema", nil); code != 200 || m["action"] == nil || m["observation"] == nil || m["state"] == nil {
		t.Errorf("/schema: %d %v", code, m)
	}
	if code, m := getJSON(t, base+"/metadata", nil); code != 200 || m["name"] != "count" || m["description"] == "" {
		t.Errorf("/metadata: %d %v", code, m)
	}
	if code, _ := getJSON(t, "http://"+addr+"/openenv/nope/health", nil); code != 404 {
		t.Errorf("/health of an unknown task: %d, want 404", code)
	}
	if _, resp, err := oeDial(t, "http://"+addr+"/openenv/nope", "", nil); err == nil || resp == nil || resp.StatusCode != 404 {
		t.Errorf("websocket of an unknown task: %v, want 404", err)
	}

	c := oeMustDial(t, base, "")
	c.fails("step", bash("ls"), "bad_request") // before reset
	obs, meta, reward, done := obsOf(t, c.ok("reset", map[string]any{"seed": 7, "episode_id": "ep-1"}, "observation"))
	sess := meta["session_id"].(string)
	reset := meta["state_id"].(string)
	if obs["instruction"] != testTask.Instruction || obs["stdout"] != testTask.Instruction || reward != nil || done || sess == "" || reset == "" || meta["turn"] != 0.0 {
		t.Fatalf("reset: obs %v reward %v done %v", obs, reward, done)
	}

	obs, meta, reward, done = obsOf(t, c.ok("step", bash("echo $ARBOR_SEED; echo 3 > /work/n"), "observation"))
	s1 := meta["state_id"].(string)
	if obs["stdout"] != "7\n" || obs["exit_code"] != 0.0 || obs["cwd"] != "/work" || reward != nil || done ||
		meta["turn"] != 1.0 || s1 == reset || meta["session_id"] != sess || meta["tool"] != "bash" {
		t.Fatalf("step: obs %v reward %v done %v", obs, reward, done)
	}
	// write_file takes text and, for bytes that are not, content_b64;
	// output that is not UTF-8 also comes as base64.
	c.ok("step", map[string]any{"tool": "write_file", "path": "t.txt", "content": "a \"quoted\"\nline"}, "observation")
	obs, _, _, _ = obsOf(t, c.ok("step", map[string]any{"tool": "read_file", "path": "t.txt"}, "observation"))
	if obs["stdout"] != "a \"quoted\"\nline" {
		t.Errorf("read_file: %v", obs)
	}
	bin := []byte{0, 0xff, 0xfe, 'x'}
	c.ok("step", map[string]any{"tool": "write_file", "path": "b.bin", "content_b64": base64.StdEncoding.EncodeToString(bin)}, "observation")
	obs, _, _, _ = obsOf(t, c.ok("step", map[string]any{"tool": "read_file", "path": "b.bin"}, "observation"))
	if got, _ := base64.StdEncoding.DecodeString(obs["stdout_b64"].(string)); string(got) != string(bin) {
		t.Errorf("binary read_file: stdout_b64 %v, want %x", obs["stdout_b64"], bin)
	}

	// Errors: the connection stays usable after each.
	if e := c.fails("step", map[string]any{"tool": "bash", "cmd": 5}, "invalid_params"); !strings.Contains(e["message"].(string), "action.cmd: want string, got integer") {
		t.Errorf("bad action: %v", e)
	}
	c.fails("step", map[string]any{"tool": "nope"}, "invalid_params")
	c.fails("step", "ls", "invalid_params")
	c.fails("step", nil, "invalid_params")
	c.fails("dance", nil, "unknown_method")
	oeErrorOf(t, c.raw(`{"type": "step", "data": {`), "malformed")
	oeErrorOf(t, c.raw(`[1, 2]`), "malformed")
	c.fails("step", map[string]any{"tool": "write_file", "path": "x", "content_b64": "%%%"}, "invalid_params")
	c.fails("rollback", map[string]any{"state_id": "snope"}, "unknown_state")

	st := c.ok("state", nil, "state")
	if st["episode_id"] != "ep-1" || st["step_count"] != 5.0 || st["session_id"] != sess || st["done"] != false {
		t.Errorf("state: %v", st)
	}
	ev := c.ok("evaluate", nil, "evaluate")
	if ev["reward"] != 1.0 {
		t.Errorf("evaluate with n=3: %v", ev)
	}

	// branch: each child is a session of its own.
	br := c.ok("branch", map[string]any{"n": 2}, "branch")
	kids, _ := br["sessions"].([]any)
	if len(kids) != 2 || br["turn"] != 5.0 {
		t.Fatalf("branch: %v", br)
	}
	k0 := oeMustDial(t, base, "?session="+kids[0].(string))
	obs, meta, _, _ = obsOf(t, k0.ok("step", bash("cat /work/n; echo 9 > /work/n"), "observation"))
	if obs["stdout"] != "3\n" || meta["session_id"] != kids[0] || meta["turn"] != 6.0 {
		t.Errorf("child step: %v", obs)
	}
	if st := k0.ok("state", nil, "state"); st["session_id"] != kids[0] || st["step_count"] != 6.0 {
		t.Errorf("child state: %v", st)
	}
	// One connection per session, also by the session's own base URL.
	if paths, _ := br["base_paths"].([]any); len(paths) != 2 || paths[0] != "/openenv/count/session/"+kids[0].(string) {
		t.Errorf("branch base_paths: %v", br["base_paths"])
	}
	dup := oeMustDial(t, "http://"+addr+"/openenv/count/session/"+kids[0].(string), "")
	oeErrorOf(t, dup.raw(`{"type": "state"}`), "bad_request")
	obs, _, _, _ = obsOf(t, c.ok("step", bash("cat /work/n"), "observation"))
	if obs["stdout"] != "3\n" {
		t.Errorf("the parent saw its child's change: %v", obs)
	}

	// rollback, states.
	rb := c.ok("rollback", map[string]any{"state_id": s1}, "rollback")
	if rb["state_id"] != s1 || rb["turn"] != 1.0 {
		t.Errorf("rollback: %v", rb)
	}
	sts := c.ok("states", nil, "states")
	if l, _ := sts["states"].([]any); sts["head"] != s1 || len(l) < 2 {
		t.Errorf("states: %v", sts)
	}
	c.ok("step", bash("echo 1 > /work/n"), "observation")

	// submit ends the episode with the verifier's reward.
	_, meta, reward, done = obsOf(t, c.ok("step", map[string]any{"tool": "submit"}, "observation"))
	if reward != 0.0 || !done || meta["submitted"] != true || meta["evaluation"] == nil {
		t.Errorf("submit: reward %v done %v meta %v", reward, done, meta)
	}
	c.fails("step", bash("ls"), "bad_request")

	// close: no answer; the session's env is closed, its children (the
	// one nobody attached to, the attached one) live on.
	if err := c.ws.WriteMessage(websocket.TextMessage, []byte(`{"type": "close"}`)); err != nil {
		t.Fatal(err)
	}
	c.ws.SetReadDeadline(time.Now().Add(time.Minute))
	if _, _, err := c.ws.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
		t.Errorf("after close: %v, want a normal close", err)
	}
	v1 := dial(t, addr, nil)
	ctx := context.Background()
	if _, err := v1.Step(ctx, sess, arbor.Bash("ls", 0)); !isCode(err, "unknown_env") {
		t.Errorf("env %s after its connection closed: %v, want unknown_env", sess, err)
	}
	obs, _, _, _ = obsOf(t, k0.ok("step", bash("cat /work/n"), "observation"))
	if obs["stdout"] != "9\n" {
		t.Errorf("attached child after its parent's close: %v", obs)
	}
	// discard closes a child; the other lives on without a connection.
	if d := k0.ok("discard", nil, "discard"); d["session_id"] != kids[0] || d["discarded"] != true {
		t.Errorf("discard: %v", d)
	}
	if _, err := v1.Step(ctx, kids[0].(string), arbor.Bash("ls", 0)); !isCode(err, "unknown_env") {
		t.Errorf("child after discard: %v, want unknown_env", err)
	}
	k1 := oeMustDial(t, base, "?session="+kids[1].(string))
	if obs, _, _, _ := obsOf(t, k1.ok("step", bash("cat /work/n"), "observation")); obs["stdout"] != "3\n" {
		t.Errorf("the other child after its parent's close: %v", obs)
	}
	k1.ok("discard", nil, "discard")
}

func isCode(err error, code string) bool {
	var pe *arbor.Error
	return errors.As(err, &pe) && pe.Code == code
}

// An infra failure is an error that says so, never a reward.
func TestOpenEnvInfraError(t *testing.T) {
	base, _ := oeBase(t, server.Options{})
	c := oeMustDial(t, base, "")
	_, meta, _, _ := obsOf(t, c.ok("reset", nil, "observation"))
	c.ok("step", bash("echo 1 > /work/n"), "observation")
	c.ok("states", nil, "states") // the head is committed
	env, err := engine.Env(meta["session_id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(env.Sandbox().InitPID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a := c.send("step", bash("cat /work/n"))
	if a.Type != "error" || a.Data["arbor_code"] != "sandbox_failed" || a.Data["code"] != "EXECUTION_ERROR" || a.Data["infra"] != true || a.Data["retryable"] != true || a.Data["reward"] != nil {
		t.Fatalf("step after its sandbox's init was killed: %s %v, want an infra error", a.Type, a.Data)
	}
	obs, _, _, _ := obsOf(t, c.ok("step", bash("cat /work/n"), "observation"))
	if obs["stdout"] != "1\n" {
		t.Errorf("after the revival: %v", obs)
	}
}

func TestOpenEnvLimitsAndToken(t *testing.T) {
	const tok = "s3cret"
	base, _ := oeBase(t, server.Options{Token: tok, MaxFrameBytes: 4096})
	if _, resp, err := oeDial(t, base, "", nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Errorf("no token: %v, want 401", err)
	}
	if _, resp, err := oeDial(t, base, "", http.Header{"Authorization": {"Bearer nope"}}); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Errorf("wrong token: %v, want 401", err)
	}
	if code, _ := getJSON(t, base+"/health", nil); code != 401 {
		t.Errorf("/health without the token: %d, want 401", code)
	}
	if code, _ := getJSON(t, base+"/health", http.Header{"Authorization": {"Bearer " + tok}}); code != 200 {
		t.Errorf("/health with the token: %d", code)
	}
	// OpenEnv's client sends no headers of its own, but websocket clients
	// (Python's websockets) send a URL's user info as Basic credentials
	// (gorilla refuses user info, so the header is set here).
	basic := http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("arbor:"+tok))}}
	c, _, err := oeDial(t, base, "", basic)
	if err != nil {
		t.Fatalf("basic credentials: %v", err)
	}
	c.ok("reset", nil, "observation")
	if _, resp, err := oeDial(t, base, "", http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("arbor:nope"))}}); err == nil || resp.StatusCode != 401 {
		t.Errorf("wrong basic credentials: %v, want 401", err)
	}
	if _, _, err := oeDial(t, base, "", http.Header{"Authorization": {"Bearer " + tok}}); err != nil {
		t.Errorf("bearer token: %v", err)
	}

	// A message over max_frame_bytes is refused and the connection stays;
	// one over four times that drops it.
	oeErrorOf(t, c.send("step", bash("echo "+strings.Repeat("x", 5000))), "too_large")
	obs, _, _, _ := obsOf(t, c.ok("step", bash("echo ok"), "observation"))
	if obs["stdout"] != "ok\n" {
		t.Errorf("after too_large: %v", obs)
	}
	c.ws.WriteMessage(websocket.TextMessage, []byte(strings.Repeat("x", 5*4096)))
	c.ws.SetReadDeadline(time.Now().Add(time.Minute))
	if _, _, err := c.ws.ReadMessage(); err == nil {
		t.Errorf("a message over 4x the limit: the connection stayed")
	}
}
