package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/inspector/watch"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/llmproxy"
)

// openInspector makes the turn classifier --inspector asks for; nil for
// "off" (every turn is then checkpointed full).
func openInspector(mode string, maxCompare int64, log *slog.Logger) (*watch.Inspector, error) {
	o := watch.Options{Logger: log, MaxCompareBytes: maxCompare}
	switch mode {
	case "off":
		return nil, nil
	case "fallback":
		return watch.NewFallback(o), nil
	case "ebpf", "auto", "":
		in, err := watch.New(o)
		if err == nil {
			log.Info("inspector: eBPF")
			return in, nil
		}
		if mode == "ebpf" || !errors.Is(err, watch.ErrUnavailable) {
			return nil, fmt.Errorf("inspector: %w (arbor doctor says why; --inspector fallback or off to run without)", err)
		}
		log.Warn("inspector: eBPF unavailable, using the snapshot backend's change lists", slog.Any("err", err))
		return watch.NewFallback(o), nil
	default:
		return nil, fmt.Errorf("--inspector %q: want auto, ebpf, fallback or off", mode)
	}
}

// TokenHeader carries the server's token on LLM proxy requests, whose
// Authorization header belongs to the upstream LLM API.
const TokenHeader = "X-Arbor-Token"

// addLLMProxy mounts the LLM reverse proxy at /v1/llm/; the proxy's
// Close stops its background checkpoints.
func addLLMProxy(routes map[string]http.Handler, co *coordinator.Coordinator, upstream string, auth tenant.Auth, log *slog.Logger) (map[string]http.Handler, *llmproxy.Proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, nil, fmt.Errorf("--llm-upstream %q: want an absolute URL such as http://127.0.0.1:8000", upstream)
	}
	p, err := llmproxy.New(llmproxy.Options{Coordinator: co, Upstream: u, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	var h http.Handler = p
	if auth.Required() {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			who, ok := auth.Authenticate(r.Header.Get(TokenHeader))
			if !ok {
				http.Error(w, `{"error":{"code":"unauthorized","message":"send the server's token in `+TokenHeader+`"}}`, http.StatusUnauthorized)
				return
			}
			r.Header.Del(TokenHeader)
			p.ServeHTTP(w, r.WithContext(tenant.With(r.Context(), who)))
		})
	}
	if routes == nil {
		routes = map[string]http.Handler{}
	}
	routes[llmproxy.Prefix] = h
	log.Info("llm proxy", slog.String("path", llmproxy.Prefix+"ENV_ID/..."), slog.String("upstream", u.String()))
	return routes, p, nil
}
