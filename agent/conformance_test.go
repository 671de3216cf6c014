package agent_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/internal/npmtest"
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
	dir := npmtest.Install(t, tsDir, "mcp-ts")
	npmtest.Script(t, tsDir, "conformance.mjs", dir)
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
