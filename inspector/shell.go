package inspector

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"
)

// ShellQuery is the command that prints the managed shell's state. It runs
// in the shell itself (not a subshell: jobs and $$ must be the shell's) and
// uses builtins only, so it forks nothing and changes nothing that lasts:
// the status line Arbor prints after every command resets $? and $_ the
// same way whatever ran before it. bash lists functions; busybox ash cannot,
// which NormalizeShellState's caller makes up for (see MayDefineFunction).
const ShellQuery = `if [ -n "${BASH_VERSION-}" ]; then
echo "shell=bash"; declare -p; declare -f; alias; shopt -p; set -o; trap -p; jobs -l
else
echo "shell=sh"; set; alias; set -o; trap; jobs -l
fi
ulimit -a; umask; echo "cwd=$PWD"; pwd -P 2>/dev/null; echo "pid=$$"`

// dynamicVars change by themselves from one command to the next.
var dynamicVars = map[string]bool{
	"_": true, "LINENO": true, "RANDOM": true, "SRANDOM": true, "SECONDS": true,
	"EPOCHSECONDS": true, "EPOCHREALTIME": true, "BASHPID": true, "BASH_COMMAND": true,
	"BASH_LINENO": true, "BASH_SOURCE": true, "FUNCNAME": true, "BASH_SUBSHELL": true,
	"HISTCMD": true, "PIPESTATUS": true, "BASH_ARGC": true, "BASH_ARGV": true,
	"BASH_ARGV0": true, "COLUMNS": true, "LINES": true,
}

var (
	bashVar = regexp.MustCompile(`^declare -[-a-zA-Z]+ ([A-Za-z_][A-Za-z0-9_]*)(=|$)`)
	shVar   = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=`)
)

// ShellState is the parsed output of ShellQuery.
type ShellState struct {
	// Digest covers everything but the dynamic variables.
	Digest string
	// PID is the shell's pid in the sandbox's pid namespace.
	PID int
	// Bash: the shell is bash (it can list its functions).
	Bash bool
	// FDs is the shell's descriptor table (FDTable), when ReadShell
	// read it; Digest covers it then.
	FDs string
}

// NormalizeShellState drops what changes by itself from ShellQuery's output
// and digests the rest.
func NormalizeShellState(out []byte) ShellState {
	var st ShellState
	h := sha256.New()
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "pid="); ok {
			st.PID, _ = strconv.Atoi(v)
			continue
		}
		if line == "shell=bash" {
			st.Bash = true
		}
		m := bashVar.FindStringSubmatch(line)
		if m == nil {
			m = shVar.FindStringSubmatch(line)
		}
		if m != nil && dynamicVars[m[1]] {
			continue
		}
		h.Write([]byte(line))
		h.Write([]byte{'\n'})
	}
	st.Digest = hex.EncodeToString(h.Sum(nil))
	return st
}

// funcDef matches what may define a shell function: "name()", "function
// name", or sourcing or eval'ing text the inspector cannot see.
var funcDef = regexp.MustCompile(`[A-Za-z0-9_.:-]\s*\(\s*\)|\bfunction\s|(^|[;&|({\s])(\.|source|eval)\s`)

// MayDefineFunction reports whether a command might define a function: a
// shell that cannot list its functions (busybox ash) must then be assumed
// changed.
func MayDefineFunction(cmd string) bool { return funcDef.MatchString(cmd) }
