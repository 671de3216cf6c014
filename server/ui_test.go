package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
)

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Timeout: 30 * time.Second}

func get(t *testing.T, url string, h http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if host := h.Get("Host"); host != "" {
		req.Host = host
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestUIAccess: the web view follows the websocket's rules. Without a
// token it answers loopback host names only (a rebinding name is
// refused); with one, a request needs it as a bearer token or in the
// cookie a visit to /?token= sets. Its answers carry the page's
// Content-Security-Policy.
func TestUIAccess(t *testing.T) {
	_, open := newServer(t, server.Options{})
	resp := get(t, "http://"+open+"/", nil)
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("GET / without a token: %d, CSP %q", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}
	if resp := get(t, "http://"+open+"/ui/api/envs", http.Header{"Host": {"arbor.attacker.example:80"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a non-loopback Host without a token: %d, want 403", resp.StatusCode)
	}
	if resp := get(t, "http://"+open+"/nope", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nope: %d, want 404", resp.StatusCode)
	}

	_, addr := newServer(t, server.Options{Token: "sesame"})
	base := "http://" + addr
	for _, path := range []string{"/", "/ui/app.js", "/ui/api/envs", "/ui/api/events"} {
		if resp := get(t, base+path, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", path, resp.StatusCode)
		}
	}
	if resp := get(t, base+"/?token=wrong", nil); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("a wrong token: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	resp = get(t, base+"/?token=sesame", nil)
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == server.TokenCookie {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("/?token=: %d, location %q, cookie %+v", resp.StatusCode, resp.Header.Get("Location"), cookie)
	}
	if resp := get(t, base+"/ui/api/envs", http.Header{"Cookie": {cookie.String()}}); resp.StatusCode != 200 {
		t.Errorf("with the cookie: %d", resp.StatusCode)
	}
	if resp := get(t, base+"/ui/api/envs", http.Header{"Authorization": {"Bearer sesame"}}); resp.StatusCode != 200 {
		t.Errorf("with the bearer token: %d", resp.StatusCode)
	}
	if resp := get(t, base+"/ui/api/envs", http.Header{"Cookie": {server.TokenCookie + "=wrong"}}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("with a wrong cookie: %d", resp.StatusCode)
	}
}

// TestUIEvents: the event stream says hello, pushes the engine's health,
// and reports a reset and a turn (with its command and exit code) as
// they happen.
func TestUIEvents(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/ui/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	events := make(chan [2]string, 64)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var name string
		for sc.Scan() {
			l := sc.Text()
			if v, ok := strings.CutPrefix(l, "event: "); ok {
				name = v
			} else if v, ok := strings.CutPrefix(l, "data: "); ok {
				events <- [2]string{name, v}
			}
		}
		close(events)
	}()
	next := func(want string) string {
		t.Helper()
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("stream ended waiting for %s", want)
				}
				if ev[0] == want {
					return ev[1]
				}
			case <-ctx.Done():
				t.Fatalf("no %s event", want)
			}
		}
	}
	next("hello")
	var h struct {
		Checkpoints map[string]float64 `json:"checkpoints"`
		// Admission control's queues, which the view shows as cards.
		Admission []struct {
			Class string `json:"class"`
			Slots int    `json:"slots"`
		} `json:"admission"`
	}
	if err := json.Unmarshal([]byte(next("health")), &h); err != nil || len(h.Checkpoints) != 4 {
		t.Errorf("health event: %v %+v", err, h)
	}
	if len(h.Admission) != len(coordinator.Classes) {
		t.Errorf("health event's admission %+v, want one queue per class %v", h.Admission, coordinator.Classes)
	}
	for i, a := range h.Admission {
		if i < len(coordinator.Classes) && (a.Class != coordinator.Classes[i] || a.Slots < 1) {
			t.Errorf("health event's admission[%d] %+v, want class %s with slots", i, a, coordinator.Classes[i])
		}
	}
	c := dial(t, addr, nil)
	r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseEnv(context.Background(), r.EnvID) })
	if d := next("reset"); !strings.Contains(d, r.EnvID) {
		t.Errorf("reset event %s, want env %s", d, r.EnvID)
	}
	step, err := c.Step(ctx, r.EnvID, arbor.Bash("echo '<script>' ; (exit 7)", 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var ev struct {
		Env, State string
		Note       struct {
			Cmd    string
			Exit   int
			Stdout string
		}
	}
	if err := json.Unmarshal([]byte(next("turn")), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Env != r.EnvID || ev.State != step.Info.StateID || ev.Note.Exit != 7 || ev.Note.Cmd != "echo '<script>' ; (exit 7)" || ev.Note.Stdout != "<script>\n" {
		t.Errorf("turn event %+v, want env %s state %s exit 7", ev, r.EnvID, step.Info.StateID)
	}
}
