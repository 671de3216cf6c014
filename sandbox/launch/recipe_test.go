package launch

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRecipeFile: which image names a launcher builds from its recipe
// folder (docs/images.md, "Recipes").
func TestRecipeFile(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"tasks-img", "debian"} {
		if err := os.WriteFile(filepath.Join(dir, n+".yaml"), []byte("base: debian\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "adir.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, image string
		auto        bool
		dir         string
		want        string
	}{
		{name: "recipe", image: "tasks-img", auto: true, dir: dir, want: filepath.Join(dir, "tasks-img.yaml")},
		{name: "no auto-build", image: "tasks-img", dir: dir},
		{name: "no folder", image: "tasks-img", auto: true},
		{name: "no recipe file", image: "other", auto: true, dir: dir},
		{name: "built-in", image: "debian", auto: true, dir: dir},
		{name: "registry reference", image: "127.0.0.1:5000/x:latest", auto: true, dir: dir},
		{name: "not a file", image: "adir", auto: true, dir: dir},
		{name: "path in the name", image: "../etc/x", auto: true, dir: dir},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &Launcher{AutoBuild: tt.auto, Recipes: tt.dir}
			if got := l.recipe(tt.image); got != tt.want {
				t.Errorf("recipe(%q) = %q, want %q", tt.image, got, tt.want)
			}
		})
	}
}
