package image_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/image"
)

// writeRecipe writes a recipe file and the files it names into a fresh
// folder and returns the recipe's path.
func writeRecipe(t *testing.T, dir, recipe string, files map[string]string) string {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "recipe.yaml")
	if err := os.WriteFile(p, []byte(recipe), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadRecipe(t *testing.T) {
	files := map[string]string{"files/x.py": "print(1)\n", "tree/a": "a"}
	tests := []struct {
		name    string
		recipe  string
		wantErr string // "" for a valid recipe
	}{
		{"full", `
base: debian
packages: [make, gcc, make]
files:
  - {src: files/x.py, dst: /opt/x.py, mode: "0755"}
  - {src: tree, dst: /srv/tree/}
run: ["echo hi > /etc/motd"]
env: ["K=V"]
workdir: /work/
user: "1000:1000"
labels: {org.arbor.other-users: "true"}
timeout: 5m
`, ""},
		{"reference base", "base: 127.0.0.1:5000/swe/py:latest\n", ""},
		{"unquoted octal mode", "base: busybox\nfiles: [{src: files/x.py, dst: /x, mode: 0644}]\n", ""},
		{"unknown field", "base: busybox\npackage: [gcc]\n", "field package not found"},
		{"unknown file field", "base: busybox\nfiles: [{src: files/x.py, dst: /x, owner: root}]\n", "field owner not found"},
		{"no base", "packages: [gcc]\n", "base: missing"},
		{"bad base", "base: Debian!\n", "base"},
		{"empty", "", "empty file"},
		{"two documents", "base: busybox\n---\nbase: debian\n", "more than one"},
		{"not yaml", "base: [busybox\n", "yaml"},
		{"relative dst", "base: busybox\nfiles: [{src: files/x.py, dst: opt/x.py}]\n", `dst "opt/x.py" is not absolute`},
		{"missing src", "base: busybox\nfiles: [{src: files/nope.py, dst: /x}]\n", `src "files/nope.py"`},
		{"absolute src", "base: busybox\nfiles: [{src: /etc/passwd, dst: /x}]\n", "is absolute"},
		{"src outside", "base: busybox\nfiles: [{src: ../x, dst: /x}]\n", "outside the recipe's folder"},
		{"dst root", "base: busybox\nfiles: [{src: tree, dst: /}]\n", "not a place"},
		{"bad mode", "base: busybox\nfiles: [{src: files/x.py, dst: /x, mode: \"0999\"}]\n", "not an octal"},
		{"mode on a directory", "base: busybox\nfiles: [{src: tree, dst: /t, mode: \"0755\"}]\n", "is a directory"},
		{"package with version", "base: debian\npackages: [gcc=12]\n", "not a Debian package name"},
		{"package option", "base: debian\npackages: [--allow-unauthenticated]\n", "not a Debian package name"},
		{"bad env", "base: busybox\nenv: [NOVALUE]\n", "not KEY=VALUE"},
		{"relative workdir", "base: busybox\nworkdir: work\n", "not absolute"},
		{"empty run", "base: busybox\nrun: [\"  \"]\n", "empty command"},
		{"bad label", "base: busybox\nlabels: {\"a b\": x}\n", "not a label key"},
		{"bad timeout", "base: busybox\ntimeout: soon\n", "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeRecipe(t, "", tt.recipe, files)
			r, err := image.LoadRecipe(p)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, image.ErrBadRecipe) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("LoadRecipe: %v (%+v), want ErrBadRecipe saying %q", err, r, tt.wantErr)
			}
			if !strings.Contains(err.Error(), p) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

// TestLoadRecipeShipped: the example recipes in images/ load.
func TestLoadRecipeShipped(t *testing.T) {
	files, err := filepath.Glob("../images/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no recipes in ../images: %v", err)
	}
	for _, f := range files {
		if _, err := image.LoadRecipe(f); err != nil {
			t.Error(err)
		}
	}
}

func TestLoadRecipeNormalizes(t *testing.T) {
	p := writeRecipe(t, "", `
base: debian
packages: [make, gcc, make]
files: [{src: x, dst: /opt//x/, mode: "0o4755"}, {src: x, dst: /opt/./y}]
workdir: /work/
`, map[string]string{"x": "x"})
	r, err := image.LoadRecipe(p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Packages, []string{"gcc", "make"}) {
		t.Errorf("packages %v, want sorted and unique", r.Packages)
	}
	if r.Files[0].Dst != "/opt/x/" || r.Files[1].Dst != "/opt/y" || r.Workdir != "/work" {
		t.Errorf("dsts %q %q workdir %q, want cleaned (a directory's trailing / kept)", r.Files[0].Dst, r.Files[1].Dst, r.Workdir)
	}
	if r.Files[0].Mode != "4755" {
		t.Errorf("mode %q, want 4755", r.Files[0].Mode)
	}
	if image.DefaultRecipeTimeout != 30*time.Minute {
		t.Errorf("default timeout %s", image.DefaultRecipeTimeout)
	}
}
