package agent_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestAgentImports pins the adapters' rule (docs/architecture.md):
// agent goes through the coordinator, so none of its packages imports the engine
// (branch), the storage primitives (cr/...), the sandbox or the task pool
// directly. Only direct imports are checked: the coordinator itself
// imports the engine.
func TestAgentImports(t *testing.T) {
	const module = "github.com/arbor-env/arbor/"
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list agent's imports: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"agent/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	forbidden := []string{"branch", "cr", "sandbox", "envpool"}
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		n++
		for imp := range strings.FieldsSeq(imports) {
			rel, ok := strings.CutPrefix(imp, module)
			for _, f := range forbidden {
				if ok && (rel == f || strings.HasPrefix(rel, f+"/")) {
					t.Errorf("%s imports %s: adapters reach the engine through the coordinator", pkg, imp)
				}
			}
		}
	}
	if n == 0 {
		t.Fatalf("go list listed no package:\n%s", out)
	}
}
