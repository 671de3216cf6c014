package server

import (
	"net/http"
	"strings"

	"github.com/arbor-env/arbor/internal/tenant"
)

// TokenCookie is the cookie the web view keeps the server's token in: a
// browser cannot set an Authorization header on an EventSource, so a
// visit to /?token=TOKEN sets it (HttpOnly, SameSite=Strict) and
// redirects to / (docs/ui.md, "Access").
const TokenCookie = "arbor_token"

// uiAccess applies the websocket's access rules to the web view. Without
// a token the server listens on loopback only (Serve), and the view also
// answers only requests that name a loopback host, so that a page of
// another site whose name resolves to 127.0.0.1 (DNS rebinding) cannot
// read it. With a token, a request presents it as "Authorization: Bearer
// TOKEN" or in TokenCookie.
func (s *Server) uiAccess(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.secured() {
			if !IsLoopback(r.Host) {
				http.Error(w, "the web view answers loopback host names only (or set a token)", http.StatusForbidden)
				return
			}
			h.ServeHTTP(w, r)
			return
		}
		if tok := r.URL.Query().Get("token"); tok != "" && r.URL.Path == "/" {
			if _, ok := s.authenticate(tok); !ok {
				http.Error(w, "bad token", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: TokenCookie, Value: tok, Path: "/", HttpOnly: true,
				SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
		tok, ok := "", false
		if hd := r.Header.Get("Authorization"); hd != "" {
			tok, ok = strings.CutPrefix(hd, "Bearer ")
		} else if c, err := r.Cookie(TokenCookie); err == nil {
			tok, ok = c.Value, true
		}
		var who tenant.Tenant
		if ok {
			who, ok = s.authenticate(tok)
		}
		if !ok {
			http.Error(w, "this server needs its token: open /?token=TOKEN once", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r.WithContext(tenant.WithToken(tenant.With(r.Context(), who), tok)))
	})
}
