package e2b_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/internal/npmtest"
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
	npmtest.Script(t, sdkDir, "conformance.mjs", dir)
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

// npmInstall installs the pinned SDK (testdata/sdk's lock file) and
// returns the folder holding node_modules.
func npmInstall(tb testing.TB) string { return npmtest.Install(tb, sdkDir, "e2b-sdk") }
