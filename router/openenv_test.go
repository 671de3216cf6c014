package router_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/envpool"
)

var oeTask = envpool.Task{Name: "count", Image: "busybox",
	Setup:       []string{"mkdir -p /work && echo 0 > /work/n && cd /work"},
	Instruction: "Make the number in /work/n at least 3.",
	Verifier:    `n=$(cat /work/n); if [ "$n" -ge 3 ]; then echo 1; else echo 0; fi`}

// oeConn is a connection to an OpenEnv endpoint, spoken as OpenEnv's
// EnvClient does (JSON text messages, one answer each).
type oeConn struct {
	t  *testing.T
	ws *websocket.Conn
}

func oeDial(t *testing.T, url string) *oeConn {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { ws.Close() })
	return &oeConn{t: t, ws: ws}
}

// call sends {"type", "data"} and returns the answer.
func (c *oeConn) call(typ string, data any) (string, map[string]any) {
	c.t.Helper()
	b, _ := json.Marshal(map[string]any{"type": typ, "data": data})
	if err := c.ws.WriteMessage(websocket.TextMessage, b); err != nil {
		c.t.Fatalf("send %s: %v", typ, err)
	}
	c.ws.SetReadDeadline(time.Now().Add(time.Minute))
	_, raw, err := c.ws.ReadMessage()
	if err != nil {
		c.t.Fatalf("answer of %s: %v", typ, err)
	}
	var a struct {
		Type string         `json:"type"`
		Data map[string]any `json:"data"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		c.t.Fatalf("answer %q: %v", raw, err)
	}
	return a.Type, a.Data
}

func (c *oeConn) obs(typ string, data any) (stdout, session string) {
	c.t.Helper()
	at, d := c.call(typ, data)
	if at != "observation" {
		c.t.Fatalf("%s: answer %s %v", typ, at, d)
	}
	o := d["observation"].(map[string]any)
	return o["stdout"].(string), o["metadata"].(map[string]any)["session_id"].(string)
}

// waitHealthy waits until a router's view has a node with the task.
func waitHealthy(t *testing.T, url, token string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(end) {
			t.Fatalf("%s never answered 200: %v", url, err)
		}
	}
}

func bash(cmd string) map[string]any { return map[string]any{"tool": "bash", "cmd": cmd} }

// TestClusterOpenEnv: the router proxies OpenEnv connections to the
// nodes: new ones placed like resets, attached sessions on their env's
// node, a dead node answered node_unavailable.
func TestClusterOpenEnv(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcdClient(t, etcd)
	a := startNode(t, etcd, "a", "127.0.0.2", oeTask)
	b := startNode(t, etcd, "b", "127.0.0.3", oeTask)
	rt, addr := startRouter(t, etcd)
	waitHealthy(t, "http://"+addr+"/openenv/count/health", "")
	for end := time.Now().Add(10 * time.Second); len(rt.View().Place(oeTask.Name, nil)) < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the router sees %d nodes with task %s, want 2", len(rt.View().Place(oeTask.Name, nil)), oeTask.Name)
		}
	}
	if resp, err := http.Get("http://" + addr + "/openenv/nope/health"); err != nil || resp.StatusCode != 404 {
		t.Errorf("an unknown task through the router: %v %v, want 404", resp, err)
	}

	ws := "ws://" + addr + "/openenv/count"
	c1, c2 := oeDial(t, ws+"/ws"), oeDial(t, ws+"/ws")
	_, s1 := c1.obs("reset", nil)
	_, s2 := c2.obs("reset", nil)
	on := map[string]string{s1: placement(t, cli, s1), s2: placement(t, cli, s2)}
	if on[s1] == on[s2] || on[s1] == "" || on[s2] == "" {
		t.Fatalf("two OpenEnv connections on two empty nodes: placed %v, want one on each", on)
	}
	// A router with a token takes it as the nodes' endpoint does (after
	// the placements: its env would count in them).
	_, taddr := startRouter(t, etcd, "router-token", "")
	waitHealthy(t, "http://"+taddr+"/openenv/count/health", "router-token")
	if _, resp, err := websocket.DefaultDialer.Dial("ws://"+taddr+"/openenv/count/ws", nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Errorf("the router's endpoint without its token: %v, want 401", err)
	}
	basic := http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("arbor:router-token"))}}
	tws, _, err := websocket.DefaultDialer.Dial("ws://"+taddr+"/openenv/count/ws", basic)
	if err != nil {
		t.Fatalf("the router's endpoint with its token: %v", err)
	}
	tc := &oeConn{t: t, ws: tws}
	if out, _ := tc.obs("reset", nil); out != oeTask.Instruction {
		t.Errorf("reset through a router with a token: %q", out)
	}
	tws.Close()

	if out, _ := c1.obs("step", bash("echo 3 > n; cat n")); out != "3\n" {
		t.Errorf("step through the router: %q", out)
	}
	at, br := c1.call("branch", map[string]any{"n": 1})
	if at != "branch" {
		t.Fatalf("branch: %s %v", at, br)
	}
	kid := br["sessions"].([]any)[0].(string)
	if n := placement(t, cli, kid); n != on[s1] {
		t.Errorf("child on %q, its parent on %q", n, on[s1])
	}
	k := oeDial(t, ws+"/session/"+kid+"/ws")
	if out, sess := k.obs("step", bash("cat n")); out != "3\n" || sess != kid {
		t.Errorf("the child through the router: %q in %s", out, sess)
	}
	// The node's refusal of an attach reaches the client as the node said
	// it (a session driven by another connection), not as node_unavailable.
	dup := oeDial(t, ws+"/ws?session="+kid)
	if at, d := dup.call("state", nil); at != "error" || d["arbor_code"] != "bad_request" {
		t.Errorf("second attach through the router: %s %v, want bad_request", at, d)
	}
	dup.ws.SetReadDeadline(time.Now().Add(time.Minute))
	if _, _, err := dup.ws.ReadMessage(); !websocket.IsCloseError(err, websocket.ClosePolicyViolation) {
		t.Errorf("after a refused attach: %v, want the node's close (policy violation)", err)
	}
	if at, ev := c1.call("evaluate", nil); at != "evaluate" || ev["reward"] != 1.0 {
		t.Errorf("evaluate: %s %v", at, ev)
	}

	// The node of c2 dies: c2 is told, as an infra error, not a reward.
	dead := b
	if on[s2] == a.id {
		dead = a
	}
	dead.kill()
	c2.ws.WriteMessage(websocket.TextMessage, []byte(`{"type": "step", "data": {"tool": "bash", "cmd": "true"}}`))
	c2.ws.SetReadDeadline(time.Now().Add(time.Minute))
	var e struct {
		Type string         `json:"type"`
		Data map[string]any `json:"data"`
	}
	if err := c2.ws.ReadJSON(&e); err != nil || e.Type != "error" || e.Data["arbor_code"] != "node_unavailable" || e.Data["infra"] != true {
		t.Errorf("after its node died: %+v %v, want a node_unavailable error", e, err)
	}

	// close through the router: no answer, the node closes the env and
	// both connections close normally.
	if dead.id != on[s1] {
		c1.ws.WriteMessage(websocket.TextMessage, []byte(`{"type": "close"}`))
		c1.ws.SetReadDeadline(time.Now().Add(time.Minute))
		if _, _, err := c1.ws.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
			t.Errorf("after close: %v, want a normal close", err)
		}
		for end := time.Now().Add(10 * time.Second); placement(t, cli, s1) != ""; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("env %s still placed after its connection's close", s1)
			}
		}
	}
}
