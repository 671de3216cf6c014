package e2b_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// sdkDir holds the pinned SDK's package files and the script.
const sdkDir = "testdata/sdk"

// sdkCases are the cases conformance.mjs runs; each must print "ok".
var sdkCases = []string{
	"create",
	"command foreground",
	"command env and cwd",
	"sandbox envs and timeout",
	"command streaming callbacks",
	"command non-zero exit",
	"command not found",
	"command timeout",
	"command background",
	"command background kill",
	"files write read list",
	"files large",
	"fork live into 4 that diverge",
	"fork from a past state and roll back",
	"snapshot",
	"pause and resume",
	"errors",
	"kill",
}

// TestSDK runs the official E2B JS SDK (npm e2b, pinned in
// testdata/sdk/package-lock.json) against the API on a loopback server,
// configured with the SDK's own environment variables only: sandboxes,
// commands, files, fork (live, paused, past states), pause and resume,
// kill and the SDK's error classes. node and npm come from make deps.
func TestSDK(t *testing.T) {
	url, _ := newServer(t)
	dir := npmInstall(t)
	script, err := os.ReadFile(filepath.Join(sdkDir, "conformance.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "conformance.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", "conformance.mjs", e2bTask.Name)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY=tok-alpha")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("node conformance.mjs:\n%s", out)
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "ok "); ok {
			seen[name] = true
		} else if strings.HasPrefix(line, "FAIL ") {
			t.Errorf("%s", line)
		}
	}
	for _, c := range sdkCases {
		if !seen[c] {
			t.Errorf("case %q did not pass", c)
		}
	}
	if err != nil {
		t.Errorf("node conformance.mjs: %v\n%s", err, stderr.Bytes())
	}
}

// npmInstall installs sdkDir's locked packages once per lock file (in
// ARBOR_NPM_CACHE, default the user cache dir) and returns the directory
// holding node_modules.
func npmInstall(t *testing.T) string { return npmInstallB(t) }

func npmInstallB(t testing.TB) string {
	t.Helper()
	for _, bin := range []string{"node", "npm"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: run make deps (it installs Debian's nodejs and npm)", bin)
		}
	}
	lock, err := os.ReadFile(filepath.Join(sdkDir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := os.ReadFile(filepath.Join(sdkDir, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(append([]byte{}, pkg...), lock...))
	root := os.Getenv("ARBOR_NPM_CACHE")
	if root == "" {
		if root, err = os.UserCacheDir(); err != nil {
			t.Fatal(err)
		}
		root = filepath.Join(root, "arbor", "npm")
	}
	dir := filepath.Join(root, "e2b-sdk-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"package.json": pkg, "package-lock.json": lock} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	return dir
}
