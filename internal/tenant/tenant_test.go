package tenant

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		file string
		ok   bool
	}{
		{"two tenants and an admin", "# teams\nta alpha\n\ntb beta\nto ops admin\n", true},
		{"two tokens of one tenant", "t1 alpha\nt2 alpha\n", true},
		{"no tenant", "ta\n", false},
		{"not admin", "ta alpha root\n", false},
		{"a token twice", "ta alpha\nta beta\n", false},
		{"empty", "# nothing\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tt.file))
			if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrTokens)) {
				t.Errorf("Parse: %v, want ok %v", err, tt.ok)
			}
		})
	}
}

func TestAuthenticate(t *testing.T) {
	toks, err := Parse(strings.NewReader("ta alpha\ntb beta\nto ops admin\n"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		auth  Auth
		token string
		want  Tenant
		ok    bool
	}{
		{"no token required", Auth{}, "", Tenant{}, true},
		{"the one token", Auth{Token: "s"}, "s", Tenant{}, true},
		{"a wrong one", Auth{Token: "s"}, "x", Tenant{}, false},
		{"a tenant's", Auth{Tokens: toks}, "tb", Tenant{Name: "beta"}, true},
		{"an admin's", Auth{Tokens: toks}, "to", Tenant{Name: "ops", Admin: true}, true},
		{"--token beside --tokens is an admin", Auth{Token: "s", Tokens: toks}, "s", Tenant{Admin: true}, true},
		{"unknown", Auth{Tokens: toks}, "tc", Tenant{}, false},
		{"empty", Auth{Tokens: toks}, "", Tenant{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.auth.Authenticate(tt.token)
			if got != tt.want || ok != tt.ok {
				t.Errorf("Authenticate(%q) = %+v %v, want %+v %v", tt.token, got, ok, tt.want, tt.ok)
			}
		})
	}
	if got := toks.Names(); strings.Join(got, ",") != "alpha,beta,ops" {
		t.Errorf("Names: %v", got)
	}
	ctx := With(context.Background(), Tenant{Name: "alpha"})
	if !From(ctx).Sees("alpha") || From(ctx).Sees("beta") || !From(Admin(ctx)).Sees("beta") || From(context.Background()) != (Tenant{}) {
		t.Error("Sees: a tenant sees its own only, an admin all, no tenant is the default")
	}
}
