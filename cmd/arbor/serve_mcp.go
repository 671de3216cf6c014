package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/arbor-env/arbor/agent"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/tenant"
)

// mcpRoutes is the agent tools' MCP endpoint of arbor serve --mcp (none
// when on is false) and a function that ends its sessions.
func mcpRoutes(on bool, addr net.Addr, co *coordinator.Coordinator, auth tenant.Auth, log *slog.Logger) (map[string]http.Handler, func(), error) {
	if !on {
		return nil, func() {}, nil
	}
	tools, err := agent.New(agent.Options{Coordinator: co, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	h := tools.Handler(agent.HandlerOptions{Token: auth.Token, Tokens: auth.Tokens, Logger: log})
	fmt.Fprintf(os.Stderr, "arbor: agent tools over MCP (streamable HTTP) at http://%s%s/ENV_ID and http://%s%s?task=NAME|image=NAME\n",
		addr, agent.MCPPath, addr, agent.MCPPath)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			log.Warn("close mcp sessions", slog.Any("err", err))
		}
	}
	return map[string]http.Handler{agent.MCPPath: h, agent.MCPPath + "/": h}, stop, nil
}
