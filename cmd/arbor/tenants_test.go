package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
)

// TestServeTokens: the real arbor serve with --tokens FILE (and --mcp):
// two tenants' clients each see and drive only their own envs, over the
// websocket, the web view, MCP and the E2B API (on by default: its REST
// and envd routes); a malformed file stops the server at start.
func TestServeTokens(t *testing.T) {
	servetest.RequireHost(t)
	dir := t.TempDir()
	bin := servetest.Bin(t)
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("tok-alpha alpha root\n"), 0o600)
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	out, err := exec.CommandContext(cctx, bin, "--state-dir", filepath.Join(dir, "state"), "serve",
		"--listen", servetest.FreeAddr(t), "--tokens", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--tokens") {
		t.Errorf("serve with a malformed tokens file: %v\n%s", err, out)
	}

	file := filepath.Join(dir, "tokens")
	os.WriteFile(file, []byte("tok-alpha alpha\ntok-beta beta\n"), 0o600)
	srv := servetest.Start(t, servetest.Options{Bin: bin, Args: []string{"--warm", "1", "--env-idle-ttl", "-1s", "--tasks", "",
		"--inspector", "off", "--mcp", "--tokens", file}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dial := func(tok string) *arbor.Client {
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			c, err := arbor.Dial(ctx, srv.Addr, &arbor.Options{Token: tok})
			if err == nil {
				if _, err = c.Hello(ctx, ""); err == nil {
					t.Cleanup(func() { c.Close() })
					return c
				}
				c.Close()
			}
			if time.Now().After(deadline) {
				t.Fatalf("server never answered: %v\n%s", err, srv.Tail())
			}
		}
	}
	a, b := dial("tok-alpha"), dial("tok-beta")
	if _, err := arbor.Dial(ctx, srv.Addr, &arbor.Options{Token: "tok-gamma"}); err == nil {
		t.Error("a token not in the file was accepted")
	}
	ra, err := a.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name       string
		c          *arbor.Client
		own, other string
	}{{"alpha", a, ra.EnvID, rb.EnvID}, {"beta", b, rb.EnvID, ra.EnvID}} {
		envs, err := tt.c.Envs(ctx)
		if err != nil || len(envs) != 1 || envs[0].EnvID != tt.own {
			t.Errorf("%s's envs: %+v %v, want only %s", tt.name, envs, err, tt.own)
		}
		_, err = tt.c.Step(ctx, tt.other, arbor.Action{Tool: "bash", Cmd: "true"})
		var pe *arbor.Error
		if !errors.As(err, &pe) || pe.Code != "unknown_env" {
			t.Errorf("%s's step on the other's env: %v, want unknown_env", tt.name, err)
		}
		if _, err := tt.c.Step(ctx, tt.own, arbor.Action{Tool: "bash", Cmd: "true"}); err != nil {
			t.Errorf("%s's step on its own env: %v", tt.name, err)
		}
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+srv.Addr+"/ui/api/envs", nil)
	req.Header.Set("Authorization", "Bearer tok-beta")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(body), ra.EnvID) || !strings.Contains(string(body), rb.EnvID) {
		t.Errorf("beta's web view: %d %s", resp.StatusCode, body)
	}
	// The E2B API: an env is a sandbox of its tenant's, and another
	// tenant's key reaches neither its REST route nor its commands.
	e2bCall := func(method, path, key, sandbox, ctype, body string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+srv.Addr+path, strings.NewReader(body))
		req.Header.Set("X-API-KEY", key)
		if sandbox != "" {
			req.Header.Set("E2b-Sandbox-Id", sandbox)
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := e2bCall("GET", "/sandboxes/"+ra.EnvID, "tok-alpha", "", "", ""); code != 200 || !strings.Contains(body, `"running"`) {
		t.Errorf("alpha's E2B sandbox info: %d %s", code, body)
	}
	if code, body := e2bCall("GET", "/sandboxes/"+ra.EnvID, "tok-beta", "", "", ""); code != http.StatusNotFound {
		t.Errorf("beta's E2B info of alpha's sandbox: %d %s, want 404", code, body)
	}
	stat := `{"path":"/"}`
	if code, body := e2bCall("POST", "/filesystem.Filesystem/Stat", "tok-alpha", ra.EnvID, "application/json", stat); code != 200 || !strings.Contains(body, "FILE_TYPE_DIRECTORY") {
		t.Errorf("alpha's E2B stat: %d %s", code, body)
	}
	if code, body := e2bCall("POST", "/filesystem.Filesystem/Stat", "tok-beta", ra.EnvID, "application/json", stat); code != http.StatusNotFound || !strings.Contains(body, "not_found") {
		t.Errorf("beta's E2B stat in alpha's sandbox: %d %s, want not_found", code, body)
	}
	req, _ = http.NewRequestWithContext(ctx, "POST", "http://"+srv.Addr+"/v1/mcp/"+ra.EnvID, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer tok-beta")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("beta's MCP attach to alpha's env: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}
}
