package origin

import (
	"net/http/httptest"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		name, host, origin string
		rule               Rule
		want               bool
	}{
		{"no origin", "127.0.0.1:7878", "", Rule{}, true},
		{"same loopback origin", "127.0.0.1:7878", "http://127.0.0.1:7878", Rule{}, true},
		{"same localhost origin", "localhost:7878", "http://localhost:7878", Rule{}, true},
		{"foreign origin", "127.0.0.1:7878", "https://evil.example", Rule{}, false},
		{"other port", "127.0.0.1:7878", "http://127.0.0.1:8080", Rule{}, false},
		{"rebound domain without token", "evil.example:7878", "http://evil.example:7878", Rule{}, false},
		{"own domain with token", "arbor.lan:7878", "https://arbor.lan:7878", Rule{Token: true}, true},
		{"allowed", "127.0.0.1:7878", "https://ui.example", Rule{Allowed: []string{"https://ui.example"}}, true},
		{"any allowed", "127.0.0.1:7878", "https://evil.example", Rule{Allowed: []string{"*"}}, true},
		{"null", "127.0.0.1:7878", "null", Rule{}, false},
		{"file scheme", "127.0.0.1:7878", "file://127.0.0.1:7878", Rule{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "http://"+tt.host+"/v1/ws", nil)
			if tt.origin != "" {
				r.Header.Set("Origin", tt.origin)
			}
			if got := tt.rule.Check(r); got != tt.want {
				t.Errorf("Check(Host %s, Origin %q) = %v, want %v", tt.host, tt.origin, got, tt.want)
			}
		})
	}
}
