package e2b_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server/e2b"
)

// onePlacer is a cluster of one node: every sandbox and state on it.
type onePlacer struct{ addr, token string }

func (p onePlacer) E2BEnvNode(_ context.Context, id string) (string, string, error) {
	if id == "" {
		return "", "", errors.New("no id")
	}
	return p.addr, p.token, nil
}

func (p onePlacer) E2BStateNode(context.Context, string) (string, string, error) {
	return p.addr, p.token, nil
}

func (p onePlacer) E2BPlace(context.Context, string) (string, string, func(), bool) {
	return p.addr, p.token, func() {}, true
}

func (p onePlacer) E2BNodes(context.Context) ([]string, []string) {
	return []string{p.addr}, []string{p.token}
}

// TestProxy: the proxy presents its node token to the node and never
// hands it to the client: the access token in create's answer is the
// client's own key, which the proxy's envd routes take; a key the proxy
// refuses goes nowhere.
func TestProxy(t *testing.T) {
	node, _ := newServer(t)
	p := e2b.NewProxy(e2b.ProxyOptions{Placer: onePlacer{addr: strings.TrimPrefix(node, "http://"), token: "tok-alpha"},
		Auth: tenant.Auth{Token: "tok-router"}, Logger: quiet()})
	mux := http.NewServeMux()
	for pat, h := range p.Routes() {
		mux.Handle(pat, h)
	}
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	url := hs.URL

	code, body := call(t, "POST", url+"/sandboxes", "tok-router", "", "application/json", `{"templateID":"e2b-task"}`)
	var sb struct{ SandboxID, EnvdAccessToken string }
	if json.Unmarshal([]byte(body), &sb); code != http.StatusCreated || sb.SandboxID == "" {
		t.Fatalf("create through the proxy: %d %s", code, body)
	}
	if sb.EnvdAccessToken != "tok-router" || strings.Contains(body, "tok-alpha") {
		t.Errorf("create's answer %s: want the client's key as access token, never the node's", body)
	}
	req, _ := http.NewRequest("POST", url+"/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/"}`))
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("stat with the access token through the proxy: %d", res.StatusCode)
	}
	if code, body := call(t, "GET", url+"/sandboxes/"+sb.SandboxID, "tok-alpha", "", "", ""); code != http.StatusUnauthorized {
		t.Errorf("the node's token at the proxy: %d %s, want 401", code, body)
	}
	if code, body := call(t, "GET", url+"/sandboxes/0123456789ab", "tok-router", "", "", ""); code != http.StatusNotFound {
		t.Errorf("an unknown sandbox through the proxy: %d %s, want 404", code, body)
	}
	if code, body := call(t, "GET", url+"/v2/sandboxes", "tok-router", "", "", ""); code != 200 || !strings.Contains(body, sb.SandboxID) {
		t.Errorf("list through the proxy: %d %s", code, body)
	}
	if code, body := call(t, "POST", url+"/sandboxes/"+sb.SandboxID+"/fork", "tok-router", "", "application/json", `{"count":2}`); code != http.StatusCreated ||
		strings.Contains(body, "tok-alpha") || strings.Count(body, `"envdAccessToken":"tok-router"`) != 2 {
		t.Errorf("fork through the proxy: %d %s", code, body)
	}
}
