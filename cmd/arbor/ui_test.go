package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
	"github.com/arbor-env/arbor/server/ui"
)

// chromium is Debian's chromium (make deps installs it). It is not
// optional where the server's tests run: a host without it fails the
// test (docs/ui.md says so).
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("ARBOR_CHROMIUM"), "/usr/bin/chromium", "chromium"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatal("chromium not installed: run make deps (or set ARBOR_CHROMIUM)")
	return ""
}

// browser starts headless Chromium (as root: no sandbox; the network
// here is closed: no background connections) and returns a tab's context.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1500, 1100))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	tab, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return tab
}

// domNode and domEdge are what the page drew, read back from the DOM.
type domNode struct {
	ID, State, Kind, Status, Env, Heads, Exit, Title string
}
type domEdge struct {
	From, To, Status string
	Branch           bool
}

const readDOM = `JSON.stringify({
  nodes: [...document.querySelectorAll('#tree g.node')].map(g => ({ID: g.dataset.id, State: g.dataset.state,
    Kind: g.dataset.kind, Status: g.dataset.status, Env: g.dataset.env, Heads: g.dataset.heads || '',
    Exit: g.dataset.exit || '', Title: g.querySelector('title').textContent})),
  edges: [...document.querySelectorAll('#tree path.edge')].map(p => ({From: p.dataset.from, To: p.dataset.to,
    Status: p.dataset.status, Branch: p.dataset.branch === '1'})),
})`

// TestWebView drives headless Chromium against the real arbor serve: an
// env of the hello task takes turns of several kinds (one whose command
// and output carry markup), is branched into two children, one of which
// is discarded, and is rolled back; the page's lineage tree must have
// exactly the engine's states with their kinds, the turns without a
// checkpoint, the branch edges, the heads, and the rolled-back and
// discarded paths marked; the markup must stay text; one more step must
// appear without a reload; 500 states must lay out. The screenshot goes
// to $ARBOR_UI_SCREENSHOT (make ui-screenshot: docs/ui.png), else the
// test's temporary folder.
func TestWebView(t *testing.T) {
	servetest.RequireHost(t)
	chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	srv, c := startServe(t, ctx, t.TempDir(), servetest.FreeAddr(t), "--inspector", "auto")
	base := "http://" + srv.Addr

	type step struct {
		env, cmd string
		r        *arbor.StepResult
	}
	var steps []step
	run := func(env, cmd string) *arbor.StepResult {
		t.Helper()
		r, err := c.Step(ctx, env, arbor.Bash(cmd, 30*time.Second))
		if err != nil {
			t.Fatalf("step %q in %s: %v", cmd, env, err)
		}
		steps = append(steps, step{env, cmd, r})
		return r
	}
	reset, err := c.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	p := reset.EnvID
	s1 := run(p, "echo hello, arbor > /work/hello/greeting.txt").Info.StateID
	run(p, "cat /work/hello/greeting.txt")
	run(p, "sleep 300 &")
	const xss = `printf '%s\n' '<script>window.__xss=1</script>' '<img src=x onerror="window.__xss=2">'; (exit 3)`
	xssStep := run(p, xss)
	br, err := c.Branch(ctx, arbor.BranchParams{EnvID: p, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, b := br.EnvIDs[0], br.EnvIDs[1]
	sa1 := run(a, "echo a > /work/hello/a").Info.StateID
	run(a, "ls /work/hello")
	run(a, "echo aa >> /work/hello/a")
	sb1 := run(b, "echo b > /work/hello/b").Info.StateID
	if err := c.Discard(ctx, b); err != nil {
		t.Fatal(err)
	}
	s3 := run(p, "echo p > /work/hello/p").Info.StateID
	if _, err := c.Rollback(ctx, p, s1); err != nil {
		t.Fatal(err)
	}
	s4 := run(p, "echo q > /work/hello/q").Info.StateID
	if xssStep.Obs.ExitCode != 3 {
		t.Fatalf("the markup step exited %d", xssStep.Obs.ExitCode)
	}

	// What the engine holds: the open envs' lineages (every state on
	// them is live), the rolled-back state and the discarded child's.
	live := map[string]string{} // state -> kind
	for _, env := range []string{p, a} {
		st, err := c.States(ctx, env)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st.States {
			live[s.StateID] = s.Kind
		}
	}
	wantStates := map[string]string{}
	for id, k := range live {
		wantStates[id] = k
	}
	kindOf := map[string]string{}
	nones := map[string]int{} // state -> turns without checkpoint on it
	for _, s := range steps {
		if s.r.Info.Checkpoint == "none" {
			nones[s.r.Info.StateID]++
		} else {
			kindOf[s.r.Info.StateID] = s.r.Info.Checkpoint
		}
	}
	for _, id := range []string{s3, sb1} {
		wantStates[id] = kindOf[id]
	}
	noneTotal := 0
	for _, n := range nones {
		noneTotal += n
	}
	if noneTotal == 0 {
		t.Fatalf("no turn was classified none (kinds: %v): the tree's none nodes go untested", kindOf)
	}

	tab := browser(t, ctx)
	if err := chromedp.Do(tab,
		chromedp.Navigate(base+"/#env="+p),
		chromedp.WaitVisible(chromedp.CSS(`#tree g.node`)),
		chromedp.Poll[chromedp.Void](`document.querySelector('#conn').textContent === 'live' && document.querySelectorAll('#health .card').length > 0`),
	); err != nil {
		t.Fatalf("load the page: %v", err)
	}
	raw, err := chromedp.Run(tab, chromedp.Evaluate[string](readDOM))
	if err != nil {
		t.Fatal(err)
	}
	var dom struct {
		Nodes []domNode
		Edges []domEdge
	}
	if err := json.Unmarshal([]byte(raw), &dom); err != nil {
		t.Fatal(err)
	}
	byID := map[string]domNode{}
	gotStates := map[string]string{}
	gotNones := map[string]int{}
	for _, n := range dom.Nodes {
		byID[n.ID] = n
		if n.Kind == "none" {
			gotNones[n.State]++
		} else {
			gotStates[n.ID] = n.Kind
		}
	}
	if !maps.Equal(gotStates, wantStates) {
		t.Errorf("state nodes (id: kind) in the page:\n%v\nthe engine's:\n%v", gotStates, wantStates)
	}
	if !maps.Equal(gotNones, nones) {
		t.Errorf("turns without checkpoint per state in the page %v, want %v", gotNones, nones)
	}
	for id, k := range kindOf {
		if n, ok := byID[id]; ok && n.Kind != k {
			t.Errorf("state %s drawn as %s, the step said %s", id, n.Kind, k)
		}
	}
	for id := range live {
		if byID[id].Status != ui.StatusLive {
			t.Errorf("state %s on an open env's path drawn %q", id, byID[id].Status)
		}
	}
	if st := byID[s3].Status; st != ui.StatusRolledBack {
		t.Errorf("the state the rollback left behind drawn %q, want rolled_back", st)
	}
	if st := byID[sb1].Status; st != ui.StatusDiscarded {
		t.Errorf("the discarded child's state drawn %q, want discarded", st)
	}
	if h := byID[s4].Heads; h != p {
		t.Errorf("heads on the parent's new state %q, want %s", h, p)
	}
	// Edges: one into every node but the roots, between drawn nodes; the
	// children's first states hang off the branch state by branch edges.
	into := map[string]domEdge{}
	for _, e := range dom.Edges {
		if _, ok := byID[e.From]; !ok {
			t.Errorf("edge from %s: no such node", e.From)
		}
		if _, ok := into[e.To]; ok {
			t.Errorf("two edges into %s", e.To)
		}
		into[e.To] = e
		if e.Status != byID[e.To].Status {
			t.Errorf("edge into %s is %s, its node %s", e.To, e.Status, byID[e.To].Status)
		}
		if e.Branch != (byID[e.From].Env != byID[e.To].Env) {
			t.Errorf("edge %s -> %s: branch %v, envs %s -> %s", e.From, e.To, e.Branch, byID[e.From].Env, byID[e.To].Env)
		}
	}
	roots := len(dom.Nodes) - len(dom.Edges)
	if roots != 1 {
		t.Errorf("%d nodes, %d edges: %d roots, want one tree", len(dom.Nodes), len(dom.Edges), roots)
	}
	for _, id := range []string{sa1, sb1} {
		if e := into[id]; !e.Branch || e.From != br.StateID {
			t.Errorf("edge into a child's first state %s: %+v, want a branch edge from %s", id, e, br.StateID)
		}
	}

	// Markup from the sandbox stays text: no script ran, no image was
	// made, and the node's title and the detail panel show it verbatim.
	xssNode := ""
	for _, n := range dom.Nodes {
		if n.Exit == "3" {
			xssNode = n.ID
			if !strings.Contains(n.Title, `<script>window.__xss=1</script>`) {
				t.Errorf("the markup turn's title %q lacks the command as text", n.Title)
			}
		}
	}
	if xssNode == "" {
		t.Fatal("no node with exit code 3")
	}
	var esc struct {
		XSS            string
		Imgs, Scripts  int
		Stdout, Status string
	}
	if err := chromedp.Do(tab,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`#tree g.node[data-id=%q] circle.dot`, xssNode))),
		chromedp.WaitVisible(chromedp.CSS(`#detail pre.stdout`)),
	); err != nil {
		t.Fatal(err)
	}
	raw, err = chromedp.Run(tab, chromedp.Evaluate[string](`JSON.stringify({XSS: String(window.__xss), Imgs: document.querySelectorAll('img').length,
		  Scripts: document.querySelectorAll('script').length, Stdout: document.querySelector('#detail pre.stdout').textContent})`))
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal([]byte(raw), &esc)
	if esc.XSS != "undefined" || esc.Imgs != 0 || esc.Scripts != 1 || !strings.Contains(esc.Stdout, `<img src=x onerror="window.__xss=2">`) {
		t.Errorf("markup from the sandbox: window.__xss %s, %d img and %d script elements (want 0 and the page's 1), stdout shown %q",
			esc.XSS, esc.Imgs, esc.Scripts, esc.Stdout)
	}

	// A live update: one more step appears without a reload.
	if _, err := chromedp.Run(tab, chromedp.Evaluate[string](`window.__marker = 'same page'`)); err != nil {
		t.Fatal(err)
	}
	live1 := run(a, "echo live > /work/hello/live").Info.StateID
	if _, err := chromedp.Run(tab, chromedp.Poll[chromedp.Void](
		fmt.Sprintf(`!!document.querySelector('#tree g.node[data-id=%q][data-heads=%q]')`, live1, a),
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the new step never appeared: %v", err)
	}
	marker, err := chromedp.Run(tab, chromedp.Evaluate[string](`String(window.__marker)`))
	if err != nil {
		t.Fatal(err)
	}
	turn, err := chromedp.Run(tab, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector('#envs tr[data-env=%q] td:nth-child(4)').textContent`, a)))
	if err != nil {
		t.Fatal(err)
	}
	if marker != "same page" {
		t.Errorf("the page reloaded (marker %q)", marker)
	}
	if want := fmt.Sprint(steps[len(steps)-1].r.Info.Turn); turn != want {
		t.Errorf("env %s's row says turn %s, want %s", a, turn, want)
	}
	time.Sleep(2500 * time.Millisecond) // a health push after the last step

	png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := os.Getenv("ARBOR_UI_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "ui.png")
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	// 500 states: a tree of that size (branching every few turns, a turn
	// without checkpoint now and then) lays out and draws in well under a
	// second, every node at its own place.
	var big struct {
		Nodes, Places int
		MS            float64
	}
	raw, err = chromedp.Run(tab, chromedp.Evaluate[string](`(() => {
	  const nodes = [];
	  for (let i = 0; i < 500; i++) {
	    const parent = i === 0 ? '' : 's' + (i % 7 === 0 ? Math.floor(i / 3) : i - 1);
	    nodes.push({id: 's' + i, state: 's' + i, parent, env: 'e' + Math.floor(i / 7), turn: i, kind: ['fs', 'proc', 'full'][i % 3],
	      status: i % 11 === 0 ? 'rolled_back' : 'live', branch: i % 7 === 0, created: ''});
	  }
	  const t0 = performance.now();
	  arborUI.setTree({nodes, envs: []});
	  const ms = performance.now() - t0;
	  const places = new Set([...document.querySelectorAll('#tree g.node')].map(g => g.getAttribute('transform')));
	  return JSON.stringify({Nodes: document.querySelectorAll('#tree g.node').length, Places: places.size, MS: ms});
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal([]byte(raw), &big)
	t.Logf("500 states: drawn in %.0f ms", big.MS)
	if big.Nodes != 500 || big.Places != 500 || big.MS > 2000 {
		t.Errorf("500 states: %d nodes at %d places in %.0f ms", big.Nodes, big.Places, big.MS)
	}

	// The JSON the page read is the coordinator's tree.
	resp, err := http.Get(base + "/ui/api/tree?env=" + p)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tree ui.Tree
	if err := json.NewDecoder(resp.Body).Decode(&tree); err != nil {
		t.Fatal(err)
	}
	if len(tree.Nodes) != len(dom.Nodes)+1 {
		t.Errorf("the tree has %d nodes now, the page drew %d before the last step", len(tree.Nodes), len(dom.Nodes))
	}
	// The task's tree holds the env's family (it is the only episode).
	resp, err = http.Get(base + "/ui/api/tree?task=hello")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var byTask ui.Tree
	if err := json.NewDecoder(resp.Body).Decode(&byTask); err != nil {
		t.Fatal(err)
	}
	ids := func(tr ui.Tree) []string {
		var out []string
		for _, n := range tr.Nodes {
			out = append(out, n.ID)
		}
		slices.Sort(out)
		return out
	}
	if got, want := ids(byTask), ids(tree); !slices.Equal(got, want) {
		t.Errorf("the task's tree %v, the env's %v", got, want)
	}
}

// TestWebViewToken: behind a token, a browser gets the page by visiting
// /?token= once: the cookie it sets carries the event stream too (an
// EventSource sends no header), so a step still appears live. A browser
// without it is refused.
func TestWebViewToken(t *testing.T) {
	servetest.RequireHost(t)
	chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const token = "open-sesame"
	srv := servetest.Start(t, servetest.Options{Args: []string{"--warm", "1", "--env-idle-ttl", "-1s", "--tasks", "", "--token", token}})
	var c *arbor.Client
	for deadline := time.Now().Add(3 * time.Minute); ; {
		var err error
		if c, err = arbor.Dial(ctx, srv.Addr, &arbor.Options{Token: token}); err == nil {
			if _, err = c.Hello(ctx, ""); err == nil {
				break
			}
			c.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("server never answered: %v\n%s", err, srv.Tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	defer c.Close()
	r, err := c.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.Addr

	tab := browser(t, ctx)
	if err := chromedp.Do(tab, chromedp.Navigate(base+"/")); err != nil {
		t.Fatal(err)
	}
	body, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, "needs its token") {
		t.Errorf("the page without the token says %q", body)
	}
	if err := chromedp.Do(tab,
		chromedp.Navigate(base+"/?token="+token),
		chromedp.WaitVisible(chromedp.CSS(`#envs tbody tr`)),
	); err != nil {
		t.Fatal(err)
	}
	loc, err := chromedp.Run(tab, chromedp.Evaluate[string](`location.href`))
	if err != nil {
		t.Fatal(err)
	}
	if loc != base+"/" {
		t.Errorf("after /?token= the page is at %s, want %s/ (the token out of the address bar)", loc, base)
	}
	wctx, wcancel := context.WithTimeout(tab, 30*time.Second)
	defer wcancel()
	if err := chromedp.Do(wctx,
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`location.hash = 'env=%s'; undefined`, r.EnvID)),
		chromedp.Poll[chromedp.Void](`document.querySelector('#conn').textContent === 'live' && document.querySelectorAll('#tree g.node').length > 0`),
	); err != nil {
		page, _ := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector('#conn').textContent + ' | ' + location.href + ' | ' + document.querySelectorAll('#tree g.node').length`))
		t.Fatalf("the tree behind the token: %v (page: %s)", err, page)
	}
	step, err := c.Step(ctx, r.EnvID, arbor.Bash("echo hello, arbor > /work/hello/greeting.txt", 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(tab, chromedp.Poll[chromedp.Void](
		fmt.Sprintf(`!!document.querySelector('#tree g.node[data-id=%q]')`, step.Info.StateID),
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the step never appeared through the token's cookie: %v", err)
	}
}
