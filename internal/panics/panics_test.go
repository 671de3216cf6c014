package panics_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/internal/panics"
)

func TestCall(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		fn      func() error
		want    error // errors.Is
		notWant error
		logged  bool
	}{
		{"no panic", func() error { return nil }, nil, panics.ErrPanic, false},
		{"error returned", func() error { return boom }, boom, panics.ErrPanic, false},
		{"panic with a string", func() error { panic("nil map") }, panics.ErrPanic, nil, true},
		{"panic with an error is not that error", func() error { panic(context.Canceled) }, panics.ErrPanic, context.Canceled, true},
		{"runtime error", func() error {
			var m map[string]int
			m["x"] = 1
			return nil
		}, panics.ErrPanic, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			err := panics.Call(log, tt.fn, slog.String("method", "step"))
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("err %v, want %v", err, tt.want)
			}
			if tt.notWant != nil && errors.Is(err, tt.notWant) {
				t.Errorf("err %v is %v", err, tt.notWant)
			}
			out := buf.String()
			if got := strings.Contains(out, "level=ERROR"); got != tt.logged {
				t.Fatalf("logged %v, want %v: %s", got, tt.logged, out)
			}
			if tt.logged && (!strings.Contains(out, "method=step") || !strings.Contains(out, "panics_test.go")) {
				t.Errorf("log line lacks the request's attrs or the stack: %s", out)
			}
		})
	}
}

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	h := panics.Handler(slog.New(slog.NewTextHandler(&buf, nil)), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/abort" {
			panic(http.ErrAbortHandler)
		}
		panic("handler bug")
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil))
	if rec.Code != http.StatusInternalServerError {
		t.Errorf("status %d, want 500", rec.Code)
	}
	if !strings.Contains(buf.String(), "handler bug") || !strings.Contains(buf.String(), `http="GET /x"`) {
		t.Errorf("log: %s", buf.String())
	}
	defer func() {
		if v := recover(); v != http.ErrAbortHandler {
			t.Errorf("ErrAbortHandler became %v, want it passed on", v)
		}
	}()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/abort", nil))
}
