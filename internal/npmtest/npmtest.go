// Package npmtest installs the npm packages a test runs with node (an
// official SDK pinned by a package-lock.json), once per lock file, into
// a cache directory.
package npmtest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Install installs the packages locked in src (a folder with
// package.json and package-lock.json) with npm ci, once per content of
// the two files, into $ARBOR_NPM_CACHE (default the user cache dir's
// arbor/npm) under name-HASH, and returns that folder (it holds
// node_modules). node and npm come from make deps (Debian's nodejs and
// npm); without them the test fails, saying so.
func Install(tb testing.TB, src, name string) string {
	tb.Helper()
	for _, bin := range []string{"node", "npm"} {
		if _, err := exec.LookPath(bin); err != nil {
			tb.Fatalf("%s not found: run make deps (it installs Debian's nodejs and npm)", bin)
		}
	}
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		tb.Fatal(err)
	}
	pkg, err := os.ReadFile(filepath.Join(src, "package.json"))
	if err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(append(append([]byte{}, pkg...), lock...))
	root := os.Getenv("ARBOR_NPM_CACHE")
	if root == "" {
		if root, err = os.UserCacheDir(); err != nil {
			tb.Fatal(err)
		}
		root = filepath.Join(root, "arbor", "npm")
	}
	dir := filepath.Join(root, name+"-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	for n, b := range map[string][]byte{"package.json": pkg, "package-lock.json": lock} {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	return dir
}

// Script copies the script src/name into dir (Install's folder), where
// node resolves its imports, and returns its path there.
func Script(tb testing.TB, src, name, dir string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(src, name))
	if err != nil {
		tb.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		tb.Fatal(err)
	}
	return p
}
