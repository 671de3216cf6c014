package router_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/internal/npmtest"
)

var e2bTask = envpool.Task{Name: "e2b-task", Image: "busybox", Instruction: "A sandbox for the E2B SDK."}

// sdkDir holds the pinned E2B SDK and its conformance script (package
// server/e2b's).
const sdkDir = "../server/e2b/testdata/sdk"

// TestClusterE2B: the E2B API through arbor router: new sandboxes placed
// over the nodes like resets, and the official SDK's conformance script
// (server/e2b's: commands, files, fork live, paused and from a past
// state, pause and resume, kill, errors) passing against the router's
// URL, with the router's token as the API key.
func TestClusterE2B(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcdClient(t, etcd)
	startNode(t, etcd, "a", "127.0.0.2", e2bTask)
	startNode(t, etcd, "b", "127.0.0.3", e2bTask)
	rt, addr := startRouter(t, etcd, "tok-router", "")
	for end := time.Now().Add(10 * time.Second); len(rt.View().Place(e2bTask.Name, nil)) < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the router sees %d nodes with task %s, want 2", len(rt.View().Place(e2bTask.Name, nil)), e2bTask.Name)
		}
	}
	url := "http://" + addr

	// Two creates on two empty nodes: one on each.
	on := map[string]bool{}
	for range 2 {
		req, _ := http.NewRequest("POST", url+"/sandboxes", strings.NewReader(`{"templateID":"e2b-task"}`))
		req.Header.Set("X-API-KEY", "tok-router")
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var sb struct{ SandboxID string }
		json.NewDecoder(res.Body).Decode(&sb)
		res.Body.Close()
		if res.StatusCode != http.StatusCreated || sb.SandboxID == "" {
			t.Fatalf("create through the router: %d", res.StatusCode)
		}
		on[placement(t, cli, sb.SandboxID)] = true
	}
	if len(on) != 2 {
		t.Errorf("two creates placed on %v, want one on each node", on)
	}

	dir := npmtest.Install(t, sdkDir, "e2b-sdk")
	script, err := os.ReadFile(npmtest.Script(t, sdkDir, "conformance.mjs", dir))
	if err != nil {
		t.Fatal(err)
	}
	cases := strings.Count(string(script), "\nawait check('")
	cmd := exec.Command("node", "conformance.mjs", e2bTask.Name)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY=tok-router")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("node conformance.mjs through the router:\n%s", out)
	passed := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ok ") {
			passed++
		} else if strings.HasPrefix(sc.Text(), "FAIL ") {
			t.Errorf("%s", sc.Text())
		}
	}
	if err != nil || passed != cases {
		t.Errorf("node conformance.mjs: %v (%d of %d cases passed)\n%s", err, passed, cases, stderr.Bytes())
	}
}
