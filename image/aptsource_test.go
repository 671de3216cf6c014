package image

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

const deb822Sample = `Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: trixie
Components: main
`

func TestAptSources(t *testing.T) {
	tests := []struct {
		name      string
		sources   []aptSource
		suite     string
		component string
		wantURI   string
		wantKey   string
		wantOK    bool
	}{
		{"deb822 main suite", parseDeb822Sources(deb822Sample), "bookworm", "main",
			"http://mirror.example/debian", "/usr/share/keyrings/debian-archive-keyring.gpg", true},
		{"deb822 security", parseDeb822Sources(deb822Sample), "bookworm-security", "main",
			"http://mirror.example/debian-security", "", true},
		{"deb822 disabled", parseDeb822Sources(deb822Sample), "trixie", "main", "", "", false},
		{"deb822 missing component", parseDeb822Sources(deb822Sample), "bookworm", "contrib", "", "", false},
		{"one-line with options", parseOneLineSources(
			"# c\ndeb-src http://src.example/debian bookworm main\n" +
				"deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main contrib # tail\n"),
			"bookworm", "main", "http://one.example/debian", "/k.gpg", true},
		{"one-line plain", parseOneLineSources("deb http://plain.example/debian bookworm main\n"),
			"bookworm", "main", "http://plain.example/debian", "", true},
		{"deb-src only", parseOneLineSources("deb-src http://src.example/debian bookworm main\n"),
			"bookworm", "main", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			uri, key, ok := findAptSource(tt.sources, tt.suite, tt.component)
			if ok != tt.wantOK || uri != tt.wantURI || key != tt.wantKey {
				t.Fatalf("findAptSource = %q, %q, %v; want %q, %q, %v", uri, key, ok, tt.wantURI, tt.wantKey, tt.wantOK)
			}
		})
	}
}

func TestHostAptSource(t *testing.T) {
	etc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(etc, "sources.list.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := hostAptSource(etc, "bookworm", "main"); !errors.Is(err, errNoAptSource) {
		t.Fatalf("empty config: %v, want errNoAptSource", err)
	}
	if err := os.WriteFile(filepath.Join(etc, "sources.list.d", "debian.sources"), []byte(deb822Sample), 0o644); err != nil {
		t.Fatal(err)
	}
	uri, _, err := hostAptSource(etc, "bookworm", "main")
	if err != nil || uri != "http://mirror.example/debian" {
		t.Fatalf("hostAptSource = %q, %v", uri, err)
	}
}
