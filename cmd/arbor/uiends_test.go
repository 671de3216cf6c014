package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
	"github.com/arbor-env/arbor/server/ui"
)

// TestWebViewEnds drives headless Chromium against the real arbor serve:
// an env of the hello task is branched into three children, one finished
// (evaluated and closed, reward 1), one discarded and one closed; the
// parent is evaluated and goes on. The page must draw the three leaves
// distinctly (status, end mark and its colour) with the finished one's
// reward, show a new evaluation's reward live, keep all of it across a
// reload, and show the diff of two nodes picked in the tree, markup in a
// file staying text.
func TestWebViewEnds(t *testing.T) {
	servetest.RequireHost(t)
	chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	srv, c := startServe(t, ctx, t.TempDir(), servetest.FreeAddr(t), "--inspector", "auto")
	base := "http://" + srv.Addr
	run := func(env, cmd string) string {
		t.Helper()
		r, err := c.Step(ctx, env, arbor.Bash(cmd, 30*time.Second))
		if err != nil || r.Obs.ExitCode != 0 {
			t.Fatalf("step %q in %s: %v %+v", cmd, env, err, r)
		}
		return r.Info.StateID
	}
	evaluate := func(env string, finish bool, want float64) {
		t.Helper()
		f := c.Evaluate
		if finish {
			f = c.Finish
		}
		ev, err := f(ctx, env)
		if err != nil || ev.Reward != want {
			t.Fatalf("evaluate %s (finish %v): %v %+v, want reward %v", env, finish, err, ev, want)
		}
	}
	reset, err := c.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	p := reset.EnvID
	s1 := run(p, `echo "$GREETING" > /work/hello/greeting.txt`)
	br, err := c.Branch(ctx, arbor.BranchParams{EnvID: p, N: 3})
	if err != nil {
		t.Fatal(err)
	}
	fin, disc, clo := br.EnvIDs[0], br.EnvIDs[1], br.EnvIDs[2]
	sFin := run(fin, "echo done > /work/hello/notes")
	evaluate(fin, true, 1)
	sDisc := run(disc, "echo b > /work/hello/b")
	if err := c.Discard(ctx, disc); err != nil {
		t.Fatal(err)
	}
	sClo := run(clo, "echo c > /work/hello/c")
	if err := c.CloseEnv(ctx, clo); err != nil {
		t.Fatal(err)
	}
	sP := run(p, `echo wrong > /work/hello/greeting.txt; printf '%s\n' '<img src=x onerror="window.__xss=3">' > /work/hello/page.html`)
	evaluate(p, false, 0)

	tab := browser(t, ctx)
	load := func() {
		t.Helper()
		if err := chromedp.Do(tab,
			chromedp.Navigate(base+"/#env="+p),
			chromedp.WaitVisible(chromedp.CSS(`#tree g.node`)),
			chromedp.Poll[chromedp.Void](`document.querySelector('#conn').textContent === 'live'`),
		); err != nil {
			t.Fatalf("load the page: %v", err)
		}
	}
	type drawn struct {
		Status, End, Reward, RewardText, Mark, Stroke string
	}
	read := func(id string) drawn {
		t.Helper()
		raw, err := chromedp.Run(tab, chromedp.Evaluate[string](fmt.Sprintf(`(() => {
		  const g = document.querySelector('#tree g.node[data-id=%q]');
		  if (!g) return '{}';
		  const m = g.querySelector('path.end-mark'), r = g.querySelector('text.reward');
		  return JSON.stringify({Status: g.dataset.status, End: g.dataset.end || '', Reward: g.dataset.reward || '',
		    RewardText: r ? r.textContent : '', Mark: m ? m.getAttribute('d') : '', Stroke: m ? getComputedStyle(m).stroke : ''});
		})()`, id)))
		if err != nil {
			t.Fatal(err)
		}
		var d drawn
		json.Unmarshal([]byte(raw), &d)
		return d
	}
	check := func(when string) {
		t.Helper()
		f, d, cl := read(sFin), read(sDisc), read(sClo)
		if f.Status != ui.StatusFinished || f.End != "finish" || f.Reward != "1" || f.RewardText != "1" || f.Mark == "" {
			t.Errorf("%s: the finished leaf drawn %+v", when, f)
		}
		if d.Status != ui.StatusDiscarded || d.End != "discard" || d.Mark == "" || d.Reward != "" {
			t.Errorf("%s: the discarded leaf drawn %+v", when, d)
		}
		if cl.Status != ui.StatusClosed || cl.End != "close" || cl.Mark == "" || cl.Reward != "" {
			t.Errorf("%s: the closed leaf drawn %+v", when, cl)
		}
		if f.Mark == d.Mark || d.Mark == cl.Mark || f.Mark == cl.Mark || f.Stroke == d.Stroke || d.Stroke == cl.Stroke || f.Stroke == cl.Stroke {
			t.Errorf("%s: the three ends are not told apart: %+v %+v %+v", when, f, d, cl)
		}
		if pn := read(sP); pn.Reward != "0" || pn.RewardText != "0" || pn.End != "" || pn.Status != ui.StatusLive {
			t.Errorf("%s: the evaluated state of the open env drawn %+v", when, pn)
		}
		if s := read(s1); s.Status != ui.StatusLive || s.Reward != "" {
			t.Errorf("%s: the branch state drawn %+v", when, s)
		}
	}
	load()
	check("first load")

	// A new evaluation's reward appears in place, without a reload.
	if _, err := chromedp.Run(tab, chromedp.Evaluate[string](`window.__marker = 'same page'`)); err != nil {
		t.Fatal(err)
	}
	sP2 := run(p, `echo "$GREETING" > /work/hello/greeting.txt`)
	if _, err := chromedp.Run(tab, chromedp.Poll[chromedp.Void](fmt.Sprintf(`!!document.querySelector('#tree g.node[data-id=%q]')`, sP2),
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the new step never appeared: %v", err)
	}
	evaluate(p, false, 1)
	if _, err := chromedp.Run(tab, chromedp.Poll[chromedp.Void](
		fmt.Sprintf(`document.querySelector('#tree g.node[data-id=%q]').dataset.reward === '1'`, sP2),
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the new reward never appeared: %v", err)
	}
	if m, _ := chromedp.Run(tab, chromedp.Evaluate[string](`String(window.__marker)`)); m != "same page" {
		t.Errorf("the page reloaded for an evaluation (marker %q)", m)
	}

	// A reload draws the same from the server's tree.
	load()
	check("after a reload")
	if s := read(sP2); s.Reward != "1" {
		t.Errorf("after a reload: the live evaluation's reward %+v", s)
	}

	// The diff of two nodes picked in the tree.
	node := func(id string) string { return fmt.Sprintf(`#tree g.node[data-id=%q] circle.dot`, id) }
	if err := chromedp.Do(tab,
		chromedp.Click(chromedp.CSS(node(s1))),
		chromedp.Click(chromedp.CSS(`#diff-from`)),
		chromedp.Click(chromedp.CSS(node(sP))),
		chromedp.Click(chromedp.CSS(`#diff-to`)),
		chromedp.WaitVisible(chromedp.CSS(`#diff .diff-file[data-path="/work/hello/page.html"]`)),
	); err != nil {
		t.Fatalf("diff two nodes: %v", err)
	}
	raw, err := chromedp.Run(tab, chromedp.Evaluate[string](`JSON.stringify({
	  files: Object.fromEntries([...document.querySelectorAll('#diff .diff-file')].map(f => [f.dataset.path, f.dataset.change + ':' + f.textContent])),
	  xss: String(window.__xss), imgs: document.querySelectorAll('img').length, title: document.querySelector('#diff-title').textContent})`))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Files      map[string]string
		XSS, Title string
		Imgs       int
	}
	json.Unmarshal([]byte(raw), &got)
	if g := got.Files["/work/hello/greeting.txt"]; !strings.HasPrefix(g, "modified:") || !strings.Contains(g, "-hello, arbor\n+wrong\n") {
		t.Errorf("greeting.txt in the diff: %q", g)
	}
	if g := got.Files["/work/hello/page.html"]; !strings.HasPrefix(g, "added:") || !strings.Contains(g, `+<img src=x onerror="window.__xss=3">`) {
		t.Errorf("page.html in the diff: %q", g)
	}
	if got.XSS != "undefined" || got.Imgs != 0 || got.Title != s1+" → "+sP {
		t.Errorf("the diff: window.__xss %s, %d img elements, title %q", got.XSS, got.Imgs, got.Title)
	}
	if shot := os.Getenv("ARBOR_UI_ENDS_SCREENSHOT"); shot != "" {
		png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		if err == nil {
			err = os.WriteFile(shot, png, 0o644)
		}
		if err != nil {
			t.Error(err)
		}
	}
}
