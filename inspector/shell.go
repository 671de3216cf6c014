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
// Its output is split into sections by marker lines (SectionMarker), so
// that ShellDelta can tell variables from functions from options. The
// directory stack is printed on its own, and first: DIRSTACK is dynamic,
// and declare -p shows it as it was when last expanded.
const ShellQuery = `if [ -n "${BASH_VERSION-}" ]; then
echo "shell=bash"; echo "@@arbor-shell dirs"; printf 'dir=%s\n' "${DIRSTACK[@]:1}"; echo "@@arbor-shell vars"; declare -p
echo "@@arbor-shell functions"; declare -f; echo "@@arbor-shell funcattrs"; declare -F; echo "@@arbor-shell aliases"; alias
echo "@@arbor-shell options"; shopt -p; set -o; echo "@@arbor-shell traps"; trap -p; echo "@@arbor-shell jobs"; jobs -l
echo "@@arbor-shell builtins"; hash -l 2>/dev/null; history; complete -p; enable -n; bind -X 2>/dev/null; bind -s 2>/dev/null
else
echo "shell=sh"; echo "@@arbor-shell dirs"; echo "@@arbor-shell vars"; set; echo "@@arbor-shell functions"
echo "@@arbor-shell funcattrs"; echo "@@arbor-shell aliases"; alias; echo "@@arbor-shell options"; set -o
echo "@@arbor-shell traps"; trap; echo "@@arbor-shell jobs"; jobs -l; echo "@@arbor-shell builtins"
fi
echo "@@arbor-shell limits"; ulimit -a; echo "@@arbor-shell umask"; umask; echo "@@arbor-shell cwd"; echo "cwd=$PWD"; pwd -P 2>/dev/null; echo "pid=$$"`

// SectionMarker starts each section of ShellQuery's output; the sections
// follow in the order of Sections.
const SectionMarker = "@@arbor-shell "

// The sections of ShellQuery's output, in order.
const (
	SectionDirs      = "dirs"      // dir=D per directory stack entry below the top
	SectionVars      = "vars"      // declare -p (bash), set (sh)
	SectionFunctions = "functions" // declare -f
	SectionFuncAttrs = "funcattrs" // declare -F: names and attributes (-x)
	SectionAliases   = "aliases"
	SectionOptions   = "options" // shopt -p, set -o
	SectionTraps     = "traps"
	SectionJobs      = "jobs"
	// SectionBuiltins: what other builtins keep (bash: the hash table,
	// which the shell's setup turns off so that commands do not fill it,
	// history, completions, disabled builtins, key bindings); empty for
	// sh (docs/inspector.md, "Kernel objects", shell rows).
	SectionBuiltins = "builtins"
	SectionLimits   = "limits" // ulimit -a
	SectionUmask    = "umask"
	SectionCwd      = "cwd" // cwd=$PWD, pwd -P
)

// Sections lists the section names in the order ShellQuery prints them.
var Sections = []string{SectionDirs, SectionVars, SectionFunctions, SectionFuncAttrs, SectionAliases, SectionOptions,
	SectionTraps, SectionJobs, SectionBuiltins, SectionLimits, SectionUmask, SectionCwd}

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
	// sections holds the output's lines by section, without the dynamic
	// variables and the pid; nil when the markers were not each found
	// once and in order (a value or function text that prints a marker
	// line), which ShellDelta refuses.
	sections map[string][]string
}

// Section returns the lines of one section of the output (Sections), and
// false when the output could not be split.
func (st ShellState) Section(name string) ([]string, bool) {
	if st.sections == nil {
		return nil, false
	}
	return st.sections[name], true
}

// NormalizeShellState drops what changes by itself from ShellQuery's output
// and digests the rest.
func NormalizeShellState(out []byte) ShellState {
	var st ShellState
	h := sha256.New()
	sections := map[string][]string{}
	cur, next, split := "", 0, true
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "pid="); ok && (cur == SectionCwd || next == 0) {
			st.PID, _ = strconv.Atoi(v)
			continue
		}
		if line == "shell=bash" && cur == "" {
			st.Bash = true
		}
		if name, ok := strings.CutPrefix(line, SectionMarker); ok {
			if next < len(Sections) && name == Sections[next] {
				cur = name
				next++
			} else {
				split = false
			}
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
		if cur != "" && !strings.HasPrefix(line, SectionMarker) {
			sections[cur] = append(sections[cur], line)
		}
	}
	st.Digest = hex.EncodeToString(h.Sum(nil))
	if split && next == len(Sections) {
		st.sections = sections
	}
	return st
}

// funcDef matches what may define a shell function: "name()", "function
// name", or sourcing or eval'ing text the inspector cannot see.
var funcDef = regexp.MustCompile(`[A-Za-z0-9_.:-]\s*\(\s*\)|\bfunction\s|(^|[;&|({\s])(\.|source|eval)\s`)

// MayDefineFunction reports whether a command might define a function: a
// shell that cannot list its functions (busybox ash) must then be assumed
// changed.
func MayDefineFunction(cmd string) bool { return funcDef.MatchString(cmd) }
