// Package tenant is who a request acts for: the tenant its token names
// (arbor serve --tokens; docs/security.md, "Tenants"). The server puts it
// in the request's context where the request authenticates; the
// coordinator reads it there and answers another tenant's envs and states
// as unknown. A context without one acts for the default tenant "", the
// owner of every env of a server without a tokens file, so a single
// tenant sees everything it made, as before tenants existed.
package tenant

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// ErrTokens is a tokens file that cannot be used.
var ErrTokens = errors.New("tokens file")

// Tenant is who a request acts for.
type Tenant struct {
	// Name owns the envs the tenant makes ("" for the default tenant).
	Name string
	// Admin sees and drives every tenant's envs and states.
	Admin bool
}

// Sees reports whether t may see and drive what owner owns.
func (t Tenant) Sees(owner string) bool { return t.Admin || owner == t.Name }

type ctxKey struct{}

// With returns ctx acting for t.
func With(ctx context.Context, t Tenant) context.Context {
	return context.WithValue(ctx, ctxKey{}, t)
}

// From is the tenant ctx acts for: the default tenant when none was set.
func From(ctx context.Context) Tenant {
	t, _ := ctx.Value(ctxKey{}).(Tenant)
	return t
}

// Tokens maps tokens to tenants.
type Tokens struct {
	tokens  [][]byte
	tenants []Tenant
}

// Load reads a tokens file (Parse).
func Load(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokens, err)
	}
	defer f.Close()
	t, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse reads tokens, one a line: "TOKEN TENANT" or "TOKEN TENANT admin";
// blank lines and lines starting with # are skipped. A tenant may have
// several tokens; a token names one tenant.
func Parse(r io.Reader) (*Tokens, error) {
	t := &Tokens{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || len(f) > 3 || (len(f) == 3 && f[2] != "admin") {
			return nil, fmt.Errorf("%w: line %d: want \"TOKEN TENANT\" or \"TOKEN TENANT admin\"", ErrTokens, n)
		}
		if seen[f[0]] {
			return nil, fmt.Errorf("%w: line %d: a token given twice", ErrTokens, n)
		}
		seen[f[0]] = true
		t.tokens = append(t.tokens, []byte(f[0]))
		t.tenants = append(t.tenants, Tenant{Name: f[1], Admin: len(f) == 3})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokens, err)
	}
	if len(t.tokens) == 0 {
		return nil, fmt.Errorf("%w: no tokens", ErrTokens)
	}
	return t, nil
}

// Lookup returns the tenant of token. It compares with every token in
// constant time, so the time it takes says nothing of which one matched.
func (t *Tokens) Lookup(token string) (Tenant, bool) {
	var found Tenant
	ok := 0
	for i, k := range t.tokens {
		if subtle.ConstantTimeCompare([]byte(token), k) == 1 {
			found, ok = t.tenants[i], 1
		}
	}
	return found, ok == 1 && token != ""
}

// Names are the tenants' names, sorted, each once.
func (t *Tokens) Names() []string {
	var out []string
	for _, x := range t.tenants {
		out = append(out, x.Name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Admin returns ctx acting for an admin: for a server's own work on
// every tenant's envs (a cluster node's drain and replicas).
func Admin(ctx context.Context) context.Context { return With(ctx, Tenant{Admin: true}) }

// Auth is a server's token rule, shared by its endpoints (the
// websocket, OpenEnv, the web view, MCP).
type Auth struct {
	// Token, when set, is accepted: the default tenant's without Tokens,
	// an admin's with them.
	Token string
	// Tokens, when set, maps tokens to tenants.
	Tokens *Tokens
}

// Required reports whether requests must present a token.
func (a Auth) Required() bool { return a.Token != "" || a.Tokens != nil }

// Authenticate returns the tenant token acts for. Without a token
// required, any token (or none) acts for the default tenant.
func (a Auth) Authenticate(token string) (Tenant, bool) {
	if !a.Required() {
		return Tenant{}, true
	}
	if a.Tokens != nil {
		if t, ok := a.Tokens.Lookup(token); ok {
			return t, true
		}
	}
	if a.Token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(a.Token)) == 1 {
		return Tenant{Admin: a.Tokens != nil}, true
	}
	return Tenant{}, false
}

type tokenKey struct{}

// WithToken returns ctx carrying the token the request presented, for a
// server that passes it on (the cluster router presents each client's
// token to the nodes, which run with the same tokens file).
func WithToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, tokenKey{}, token)
}

// Token is the token ctx carries ("" when none).
func Token(ctx context.Context) string {
	t, _ := ctx.Value(tokenKey{}).(string)
	return t
}
