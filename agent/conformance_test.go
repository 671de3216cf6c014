package agent_test

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

// tsDir is the TypeScript conformance client: package.json pins the
// official SDK (@modelcontextprotocol/sdk) and package-lock.json its
// dependencies.
const tsDir = "testdata/mcp-ts"

// tsCases are the cases conformance.mjs prints, each "ok NAME" or "FAIL
// NAME: why".
var tsCases = []string{
	"connect (initialize, session id)",
	"capabilities: tools, prompts and resources, no listChanged",
	"tools/list",
	"tools/call bash (the first result carries the instruction)",
	"prompts/list and prompts/get task",
	"resources/list and resources/read arbor://task/instruction",
	"foreign Origin: 403",
	"request without a session id (not initialize): 400",
	"session of one task used on another: 400 naming both",
	"unknown session id: 404",
	"terminated session: 404",
}

// TestMCPTypeScriptSDK runs the official TypeScript SDK's client
// (StreamableHTTPClientTransport) against the endpoint: the happy path
// (initialize, tools, the task's prompt and resource) and the transport's
// failure cases. node and npm come from make deps (Debian's nodejs and
// npm); the SDK is installed by npm ci from the lock file into a cache
// directory keyed by it (ARBOR_NPM_CACHE, default the user cache dir).
func TestMCPTypeScriptSDK(t *testing.T) {
	s := newTaskServer(t, "", transportTasks...)
	dir := npmInstall(t)
	script, err := os.ReadFile(filepath.Join(tsDir, "conformance.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "conformance.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", "conformance.mjs", "http://"+s.addr, "mcp-a", "mcp-b", instructionA)
	cmd.Dir = dir
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
	for _, c := range tsCases {
		if !seen[c] {
			t.Errorf("case %q did not pass", c)
		}
	}
	if err != nil {
		t.Errorf("node conformance.mjs: %v\n%s", err, stderr.Bytes())
	}
}

// npmInstall installs tsDir's locked packages once per lock file and
// returns the directory holding node_modules.
func npmInstall(t *testing.T) string {
	t.Helper()
	for _, bin := range []string{"node", "npm"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: run make deps (it installs Debian's nodejs and npm)", bin)
		}
	}
	lock, err := os.ReadFile(filepath.Join(tsDir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := os.ReadFile(filepath.Join(tsDir, "package.json"))
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
	dir := filepath.Join(root, "mcp-ts-"+hex.EncodeToString(sum[:6]))
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
