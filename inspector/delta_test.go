package inspector

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/sandbox/shcmd"
)

// bashState runs script in a fresh bash (aliases on, as in the managed
// interactive shell) in dir and returns the ShellQuery state it ends in.
func bashState(t *testing.T, dir, script string) ShellState {
	t.Helper()
	cmd := exec.Command("bash", "--norc", "--noprofile")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/root", "LANG=C"}
	cmd.Stdin = strings.NewReader("shopt -s expand_aliases\n" + script + "\n" + ShellQuery + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	return NormalizeShellState(out)
}

// applyDelta runs from, then the delta script as init runs a command
// (eval of its text in the shell itself), and returns the state.
func applyDelta(t *testing.T, dir, from, delta string) ShellState {
	t.Helper()
	f := filepath.Join(t.TempDir(), "delta")
	if err := os.WriteFile(f, []byte(delta), 0o644); err != nil {
		t.Fatal(err)
	}
	return bashState(t, dir, from+"\n__d=$(cat "+shcmd.Quote(f)+"); { eval \"$__d\"; } </dev/null; unset __d")
}

func TestShellDelta(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skipf("bash not installed: %v", err)
	}
	dir := t.TempDir()
	for _, d := range []string{"a", "b", "c d", "it's"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "link"))
	base := `export KEEP=1; A=(x y); f() { echo f; }; alias ll='ls -l'; cd a`
	tests := []struct {
		name     string
		from, to string // to runs after from
		refuse   bool
		empty    bool
	}{
		{name: "same", from: base, to: `:`, empty: true},
		{name: "export", from: base, to: `export NEW="two words" KEEP=2`},
		{name: "unexport", from: base, to: `export -n KEEP`},
		{name: "unset", from: base, to: `unset KEEP A`},
		{name: "declared without value", from: base, to: `unset KEEP; declare KEEP`},
		{name: "quotes and newlines", from: base, to: `Q=$'it\'s "q"\n$x\\'; R='@@arbor-shell vars'`},
		{name: "arrays", from: base, to: `A=([3]=z); declare -A M=([k]="v v" [j]=1); declare -i N=6*7; declare -l L=ABC`},
		{name: "array to assoc", from: base, to: `unset A; declare -A A=([k]=v)`},
		{name: "cd", from: base, to: `cd ../b`},
		{name: "cd odd names", from: base, to: `cd "../c d"; cd "../it's"`},
		{name: "cd through symlink", from: base, to: `cd ../link`},
		{name: "cd back", from: base, to: `cd ../b; cd ../a`, empty: false},
		{name: "pushd", from: base, to: `pushd ../b >/dev/null; pushd "../c d" >/dev/null`},
		{name: "popd", from: base + `; pushd ../b >/dev/null`, to: `popd >/dev/null`},
		{name: "dirs rotated", from: base + `; pushd ../b >/dev/null; pushd ../c\ d >/dev/null`, to: `pushd +1 >/dev/null`},
		{name: "function", from: base, to: `g() { local x=1; for i in 1 2; do echo "$i$x"; done; }`},
		{name: "function redefined", from: base, to: `f() { echo other; }`},
		{name: "function removed", from: base, to: `unset -f f`},
		{name: "function exported", from: base, to: `export -f f`},
		{name: "function with alias word", from: base + `; alias ls='ls -x'`, to: `g() { ls; }`},
		{name: "function with extglob", from: base, to: "shopt -s extglob\ng() { case $1 in +(a|b)) echo ab;; esac; }\nshopt -u extglob"},
		{name: "alias", from: base, to: `alias la='ls -a'; unalias ll`},
		{name: "alias multi-line", from: base, to: `alias m='echo a
echo b'`},
		{name: "set -o", from: base, to: `set -o noglob; set -u; set -o pipefail`},
		{name: "set +o", from: base + `; set -o noclobber -o allexport`, to: `set +o noclobber +o allexport; X=1`},
		{name: "allexport kept", from: base + `; set -a`, to: `Y=2`},
		{name: "errexit", from: base, to: `set -e`},
		{name: "keyword and nounset in the image", from: base + "; set -k -u", to: `Z=1; export Z; f() { :; }`},
		{name: "shopt", from: base, to: `shopt -s nullglob globstar; shopt -u expand_aliases`},
		{name: "umask", from: base, to: `umask 077`},
		{name: "PWD assigned", from: base, to: `PWD=/nonexistent`},
		{name: "everything", from: base, to: `cd ..; pushd b >/dev/null; export E=1; h() { :; }; alias e=echo; set -o noglob; umask 027`},

		{name: "trap", from: base, to: `trap 'echo bye' EXIT`, refuse: true},
		{name: "readonly", from: base, to: `readonly RO=1`, refuse: true},
		{name: "nameref", from: base, to: `declare -n REF=KEEP`, refuse: true},
		{name: "ulimit", from: base, to: `ulimit -S -n 100`, refuse: true},
		{name: "BASH_REMATCH", from: base, to: `[[ ab =~ a(b) ]]`, refuse: true},
		{name: "prompt command", from: base, to: `PROMPT_COMMAND='N=$((N+1))'`, refuse: true},
		{name: "function named declare", from: base, to: `declare() { builtin declare "$@"; }`, refuse: true},
		{name: "forged marker in function", from: base, to: "g() { cat <<'E'\n@@arbor-shell vars\nE\n}", refuse: true},
		{name: "monitor", from: base, to: `set -o posix`, refuse: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			from := bashState(t, dir, tt.from)
			to := bashState(t, dir, tt.from+"\n"+tt.to)
			to.PID = from.PID
			script, ok := ShellDelta(from, to)
			if tt.refuse {
				if ok {
					t.Fatalf("delta accepted, want refused:\n%s", script)
				}
				return
			}
			if !ok {
				t.Fatalf("delta refused")
			}
			if tt.empty != (script == "") {
				t.Fatalf("script %q, want empty %v", script, tt.empty)
			}
			got := applyDelta(t, dir, tt.from, script)
			if got.Digest != to.Digest {
				for _, s := range Sections {
					g, _ := got.Section(s)
					w, _ := to.Section(s)
					if strings.Join(g, "\n") != strings.Join(w, "\n") {
						t.Errorf("section %s:\ngot  %q\nwant %q", s, g, w)
					}
				}
				t.Fatalf("state after the delta differs; script:\n%s", script)
			}
		})
	}
}

func TestShellQuerySections(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skipf("bash not installed: %v", err)
	}
	st := bashState(t, t.TempDir(), `pushd / >/dev/null; X=1`)
	if !st.Bash || st.PID == 0 {
		t.Fatalf("bash %v pid %d", st.Bash, st.PID)
	}
	for _, s := range Sections {
		if _, ok := st.Section(s); !ok {
			t.Fatalf("section %s missing", s)
		}
	}
	if d, _ := st.Section(SectionDirs); len(d) != 1 || !strings.HasPrefix(d[0], "dir=/") {
		t.Fatalf("dirs %q", d)
	}
	forged := bashState(t, t.TempDir(), `X=1; alias a='
@@arbor-shell vars'`)
	if _, ok := forged.Section(SectionVars); ok {
		t.Fatal("a forged marker was taken for a section")
	}
}
