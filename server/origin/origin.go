// Package origin is the one rule by which the server's browser-reachable
// endpoints (the protocol websocket /v1/ws, the agent tools' MCP endpoint
// /v1/mcp) accept a request's Origin header: a web page of another site,
// or of a domain that a DNS rebinding pointed at this server, must not
// drive it (docs/security.md, "Origin").
package origin

import (
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Rule says which Origins a server accepts beside its own.
type Rule struct {
	// Allowed are browser origins accepted besides the server's own
	// ("*": any).
	Allowed []string
	// Token: the server requires a token, which a page of another site
	// does not have; then same-origin counts for any host name.
	Token bool
}

// Check reports whether r may be served: it has no Origin header
// (programs), an Allowed one, or one that is the server's own host
// (same-origin: scheme aside, its host and port are the Host the request
// was sent to). Without a token, same-origin counts only for a host that
// is an IP address or localhost: a page of a domain that a DNS rebinding
// pointed at this server has itself as both Origin and Host.
func (o Rule) Check(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	for _, a := range o.Allowed {
		if a == origin || a == "*" {
			return true
		}
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	switch u.Scheme {
	case "http", "https", "ws", "wss":
	default:
		return false
	}
	if !strings.EqualFold(u.Host, r.Host) {
		return false
	}
	if o.Token {
		return true
	}
	host := u.Hostname()
	return strings.EqualFold(host, "localhost") || net.ParseIP(host) != nil
}

// Refuse answers a request Check refused: 403.
func Refuse(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "Origin "+r.Header.Get("Origin")+" may not use this server: a web page of another site (docs/security.md, Origin)", http.StatusForbidden)
}
