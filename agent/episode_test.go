package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/arbor-env/arbor/agent"
)

// The scripted agent's "project": a shell program with a build script
// that syntax-checks the sources, bundles them and runs a test.
const (
	greetSh = `greet() {
	echo "hello, $1"
}
`
	buildSh = `#!/bin/sh
# The build: syntax-check every source, bundle them into out/app, test it.
for f in src/*.sh; do
	sh -n "$f" || { echo "build: syntax error in $f" >&2; exit 2; }
done
mkdir -p out
cat src/*.sh > out/app
echo 'greet "${1:-world}"' >> out/app
test "$(sh out/app arbor)" = "hello, arbor" || { echo "build: test failed" >&2; exit 1; }
echo "BUILD OK: out/app, $(wc -l < out/app) lines"
`
	// The feature the agent means to add, first botched (an unclosed
	// quote), then written properly after the rollback.
	shoutBroken = `cat >> src/greet.sh <<'EOF'
shout() {
	echo "HELLO, $(echo $1 | tr a-z A-Z)!
}
EOF`
	shoutSh = `shout() {
	echo "HELLO, $(echo "$1" | tr a-z A-Z)!"
}
`
)

// transcript records an episode as the docs show it.
type transcript struct {
	t  *testing.T
	cs *mcp.ClientSession
	b  strings.Builder
}

// call makes one tool call, records it with its wall time and returns the
// result.
func (tr *transcript) call(tool string, args map[string]any) *mcp.CallToolResult {
	tr.t.Helper()
	start := time.Now()
	r, err := tr.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	took := time.Since(start)
	if err != nil {
		tr.t.Fatalf("%s: protocol error: %v", tool, err)
	}
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var as []string
	for _, k := range keys {
		var v strings.Builder
		enc := json.NewEncoder(&v)
		enc.SetEscapeHTML(false)
		enc.Encode(args[k])
		s := strings.TrimSpace(v.String())
		if len(s) > 70 {
			s = s[:60] + `…"`
		}
		as = append(as, k+"="+s)
	}
	status := ""
	if r.IsError {
		status = " [tool error]"
	}
	fmt.Fprintf(&tr.b, "\n>>> %s(%s)   # %d ms%s\n%s\n", tool, strings.Join(as, ", "), took.Milliseconds(), status, text(r))
	return r
}

func (tr *transcript) bash(cmd string) agent.BashResult {
	tr.t.Helper()
	r := tr.call("bash", map[string]any{"cmd": cmd})
	var out agent.BashResult
	decode(tr.t, r, &out)
	return out
}

func decode(t *testing.T, r *mcp.CallToolResult, out any) {
	t.Helper()
	if r.IsError {
		t.Fatalf("tool error: %s", text(r))
	}
	b, _ := json.Marshal(r.StructuredContent)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
}

// TestScriptedEpisode is the worked example of docs/agent-tools.md: a
// fixed sequence of tool calls, through the SDK's own client, that builds
// a small project, breaks it, fails to patch it by hand, lists its
// states, rolls back, makes the change properly and finishes. Set
// ARBOR_EPISODE_TRANSCRIPT=FILE to write the transcript there.
func TestScriptedEpisode(t *testing.T) {
	s := newServer(t, "")
	cs := mustConnect(t, "http://"+s.addr+"/v1/mcp?image=busybox", "")
	tr := &transcript{t: t, cs: cs}

	tr.call("write_file", map[string]any{"path": "/work/project/src/greet.sh", "content": greetSh})
	tr.call("write_file", map[string]any{"path": "/work/project/build.sh", "content": buildSh})
	if r := tr.bash("cd /work/project && sh build.sh"); r.ExitCode != 0 {
		t.Fatalf("first build: %+v", r)
	}
	good := tr.bash("sh out/app Ada")
	if good.Stdout != "hello, Ada\n" {
		t.Fatalf("app: %+v", good)
	}

	// The agent adds a feature carelessly, then "fixes" it worse.
	tr.bash(shoutBroken)
	if r := tr.bash("sh build.sh"); r.ExitCode == 0 {
		t.Fatalf("broken build passed: %+v", r)
	}
	tr.bash(`sed -i '$d' src/greet.sh && rm -rf out`)
	if r := tr.bash("sh build.sh"); r.ExitCode == 0 {
		t.Fatalf("broken build passed: %+v", r)
	}
	// Would one more patch do? Try it on a throwaway copy first.
	var ft agent.ForkTryResult
	decode(t, tr.call("fork_try", map[string]any{"cmd": `echo '}' >> src/greet.sh && sh build.sh`}), &ft)
	if ft.ExitCode == 0 {
		t.Fatalf("the patch fixed it after all: %+v", ft)
	}

	// Give up repairing by hand: find the last good state and go back.
	var ls agent.ListStatesResult
	decode(t, tr.call("list_states", map[string]any{}), &ls)
	var rb agent.RollbackResult
	decode(t, tr.call("rollback", map[string]any{"state_id": good.StateID}), &rb)
	if rb.Turn != good.Turn {
		t.Fatalf("rollback: %+v, want turn %d", rb, good.Turn)
	}

	// Continue: write the feature properly and build.
	tr.call("write_file", map[string]any{"path": "src/shout.sh", "content": shoutSh})
	if r := tr.bash("sh build.sh && sh out/app world && . out/app >/dev/null && shout arbor"); r.ExitCode != 0 ||
		!strings.HasSuffix(r.Stdout, "hello, world\nHELLO, ARBOR!\n") {
		t.Fatalf("final build: %+v", r)
	}
	tr.call("list_states", map[string]any{"limit": 4})

	t.Logf("transcript:\n%s", tr.b.String())
	if p := os.Getenv("ARBOR_EPISODE_TRANSCRIPT"); p != "" {
		if err := os.WriteFile(p, []byte(tr.b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
