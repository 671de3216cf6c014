package ui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/coordinator"
)

// TestNoMarkupSinks: the page's script never turns strings into markup,
// so nothing from a sandbox can become HTML (docs/ui.md, "Access and
// escaping"); the browser test checks the outcome, this the rule.
func TestNoMarkupSinks(t *testing.T) {
	b, err := static.ReadFile("static/app.js")
	if err != nil {
		t.Fatal(err)
	}
	sinks := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|createContextualFragment|DOMParser|srcdoc|setAttribute\(['"]on`)
	for i, l := range strings.Split(string(b), "\n") {
		if m := sinks.FindString(l); m != "" && !strings.HasPrefix(strings.TrimSpace(l), "//") {
			t.Errorf("app.js:%d uses %s: %s", i+1, m, strings.TrimSpace(l))
		}
	}
}

// TestStatic: the page, its script and style are served with the
// page's security headers; other paths are not found.
func TestStatic(t *testing.T) {
	u, err := New(Options{Coordinator: &coordinator.Coordinator{}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(u.Handler())
	defer hs.Close()
	for _, tt := range []struct {
		name, path, want string
		code             int
	}{
		{"page", "/", `<script src="/ui/app.js" defer></script>`, 200},
		{"script", "/ui/app.js", "'use strict';", 200},
		{"style", "/ui/app.css", "--fs:", 200},
		{"unknown", "/nope", "", 404},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Get(hs.URL + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.code || !strings.Contains(string(b), tt.want) {
				t.Errorf("GET %s: %d, body lacks %q", tt.path, resp.StatusCode, tt.want)
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
				t.Errorf("GET %s: CSP %q", tt.path, csp)
			}
		})
	}
}
