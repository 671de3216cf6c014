package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server/ui"
)

// getJSON reads a router's web-view JSON at path into v and returns the
// status.
func getJSON(t *testing.T, addr, path string, v any) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	return resp.StatusCode
}

// TestWebViewThroughRouter: arbor router serves the web view of the whole
// cluster (two real nodes on 127.0.0.2 and .3): the page, the table with
// every node's envs and the node each is on, each env's tree from its
// node, the summed health, and the nodes' events in one stream.
func TestWebViewThroughRouter(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startNode(t, etcd, "a", "127.0.0.2")
	b := startNode(t, etcd, "b", "127.0.0.3")
	rt, addr := startRouter(t, etcd)
	for end := time.Now().Add(5 * time.Second); len(rt.View().Nodes()) < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("router sees nodes %v, want a and b", rt.View().Nodes())
		}
	}
	ctx := context.Background()
	c := dial(t, addr)

	// The event stream first, so that it sees the turn below.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/ui/api/events", nil)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(sctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %s %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	events := make(chan string, 64) // "event data" lines
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		var ev string
		for sc.Scan() {
			switch l := sc.Text(); {
			case strings.HasPrefix(l, "event: "):
				ev = strings.TrimPrefix(l, "event: ")
			case strings.HasPrefix(l, "data: "):
				events <- ev + " " + strings.TrimPrefix(l, "data: ")
			}
		}
	}()
	// The router subscribes to the nodes when the stream opens: the
	// hello event says it has.
	waitEvent := func(what string, match func(typ, data string) bool) string {
		t.Helper()
		for {
			select {
			case e, ok := <-events:
				if !ok {
					t.Fatalf("event stream ended before %s", what)
				}
				typ, data, _ := strings.Cut(e, " ")
				if match(typ, data) {
					return data
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no %s event within 30 s", what)
			}
		}
	}
	waitEvent("hello", func(typ, _ string) bool { return typ == "hello" })

	// One env on each node (two resets on two empty nodes).
	on := map[string]string{}
	for i := 0; i < 2; i++ {
		r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		on[r.EnvID] = ""
		defer c.CloseEnv(ctx, r.EnvID)
	}
	var envs ui.EnvsAnswer
	if code := getJSON(t, addr, "/ui/api/envs", &envs); code != http.StatusOK {
		t.Fatalf("envs: %d", code)
	}
	nodes := map[string]bool{}
	for _, e := range envs.Envs {
		if _, ok := on[e.ID]; ok {
			on[e.ID] = e.Node
			nodes[e.Node] = true
		}
	}
	if len(envs.Envs) != 2 || !nodes[a.id] || !nodes[b.id] || len(envs.Unavailable) != 0 {
		t.Fatalf("envs through the router: %+v, want one env on each of a and b", envs)
	}

	for env := range on {
		sh(t, c, env, "echo hi > /tmp/x")
		data := waitEvent("turn of "+env, func(typ, data string) bool {
			var ev ui.Event
			return typ == coordinator.EventTurn && json.Unmarshal([]byte(data), &ev) == nil && ev.Env == env
		})
		var ev ui.Event
		json.Unmarshal([]byte(data), &ev)
		var tree ui.Tree
		if code := getJSON(t, addr, "/ui/api/tree?env="+env, &tree); code != http.StatusOK {
			t.Fatalf("tree of %s: %d", env, code)
		}
		found := false
		for _, n := range tree.Nodes {
			found = found || (n.State == ev.State && n.Env == env)
		}
		if !found || len(tree.Envs) != 1 || tree.Envs[0].ID != env {
			t.Errorf("tree of %s (on %s): %+v, want its envs and the turn's state %s", env, on[env], tree, ev.State)
		}
	}

	var h coordinator.Health
	if code := getJSON(t, addr, "/ui/api/health", &h); code != http.StatusOK {
		t.Fatalf("health: %d", code)
	}
	disks := map[string]bool{}
	for _, d := range h.Disk {
		disks[strings.SplitN(d.Name, "/", 2)[0]] = true
	}
	if h.ActiveEnvs != 2 || !disks[a.id] || !disks[b.id] {
		t.Errorf("health through the router: active envs %d, disks %+v; want 2 and both nodes' disks", h.ActiveEnvs, h.Disk)
	}

	if code := getJSON(t, addr, "/ui/api/tree?env=nope", nil); code != http.StatusNotFound {
		t.Errorf("tree of an unknown env: %d, want 404", code)
	}
	if code := getJSON(t, addr, "/ui/api/tree", nil); code != http.StatusBadRequest {
		t.Errorf("tree without a scope: %d, want 400", code)
	}
	page, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	page.Body.Close()
	if page.StatusCode != http.StatusOK || !strings.HasPrefix(page.Header.Get("Content-Type"), "text/html") {
		t.Errorf("page through the router: %s %q", page.Status, page.Header.Get("Content-Type"))
	}

	// A node that dies: the event stream ends as dropped (the page
	// reconnects and reloads).
	b.kill()
	waitEvent("resync after node b died", func(typ, _ string) bool { return typ == "resync" })
}
