package branch_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/arbor-env/arbor/"

// TestBranchImports pins the layering of docs/engine.md ("Packages"): the
// engine reaches the Inspector through the branch.Inspector interface, so
// it does not link the eBPF tracker (bpf, inspector/watch), and it imports
// nothing of the layers above it. cilium/ebpf comes in only through
// sandbox, whose device filter is a cgroup eBPF program.
func TestBranchImports(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list branch's imports: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"branch").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{"bpf", "inspector/watch", "envpool", "coordinator", "server", "agent", "llmproxy", "cmd", "benchmarks"}
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		n++
		if rel, ok := strings.CutPrefix(pkg, module); ok {
			for _, f := range forbidden {
				if rel == f || strings.HasPrefix(rel, f+"/") {
					t.Errorf("branch depends on %s", pkg)
				}
			}
		}
		for imp := range strings.FieldsSeq(imports) {
			if strings.HasPrefix(imp, "github.com/cilium/ebpf") && !strings.HasPrefix(pkg, "github.com/cilium/ebpf") && pkg != module+"sandbox" {
				t.Errorf("%s imports %s: only sandbox may bring eBPF into the engine", pkg, imp)
			}
		}
	}
	if n < 10 { // branch alone has more direct imports than this
		t.Fatalf("go list -deps listed %d packages:\n%s", n, out)
	}
}
