package inspector

import (
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/arbor-env/arbor/sandbox/shcmd"
)

// ShellDelta is a bash script that, run in the restored shell of a process
// image whose shell state was from, brings it to the state to
// (docs/inspector.md, "Shell deltas"), and ok; the script is empty when
// the two states are the same. It covers what a shell's own commands
// change declaratively: the working directory, the directory stack,
// variables, functions, aliases, options and the umask. Anything else
// that differs (descriptors, limits, traps, jobs, readonly variables,
// namerefs, bash's own BASH*, COMP_* and GROUPS variables), or a state it
// cannot parse, makes ok false: such a state needs a process image.
//
// The script must not be trusted blindly: the restore compares the
// shell's digest after running it with to.Digest.
func ShellDelta(from, to ShellState) (script string, ok bool) {
	if !from.Bash || !to.Bash || from.sections == nil || to.sections == nil {
		return "", false
	}
	if from.PID != to.PID || from.FDs != to.FDs {
		return "", false
	}
	if from.Digest == to.Digest {
		return "", true
	}
	f, t := from.sections, to.sections
	for _, s := range []string{SectionTraps, SectionJobs, SectionBuiltins, SectionLimits} {
		if !slices.Equal(f[s], t[s]) {
			return "", false
		}
	}
	if !safeTraps(t[SectionTraps]) {
		return "", false
	}
	fv, okF := parseVars(f[SectionVars])
	tv, okT := parseVars(t[SectionVars])
	if !okF || !okT || !safeVars(fv) || !safeVars(tv) {
		return "", false
	}
	fFuncs, okF := parseFuncAttrs(f[SectionFuncAttrs])
	tFuncs, okT := parseFuncAttrs(t[SectionFuncAttrs])
	if !okF || !okT {
		return "", false
	}
	for _, name := range []string{"declare", "builtin", "alias"} {
		// The script calls declare and alias unquoted (only so do
		// declare's compound assignments parse) and \builtin, which
		// finds a function of that name first.
		if _, ok := fFuncs[name]; ok {
			return "", false
		}
		if _, ok := tFuncs[name]; ok {
			return "", false
		}
	}
	fAliases, tAliases := f[SectionAliases], t[SectionAliases]
	if hasAlias(fAliases, "declare") {
		return "", false
	}
	fOpts, okF := parseOptions(f[SectionOptions])
	tOpts, okT := parseOptions(t[SectionOptions])
	if !okF || !okT || len(fOpts.order) != len(tOpts.order) {
		return "", false
	}
	for _, l := range t[SectionDirs] {
		if !strings.HasPrefix(l, "dir=") {
			return "", false // a directory name with a newline
		}
	}

	var b strings.Builder
	line := func(s string) { b.WriteString(s); b.WriteByte('\n') }
	// What would change how the rest runs is off while it runs; the
	// options at the end set it as in to.
	cur := maps.Clone(fOpts.val)
	for _, o := range []string{"set:allexport", "set:errexit", "set:nounset", "set:xtrace", "set:verbose", "set:noclobber", "set:keyword"} {
		if cur[o] == "on" {
			line(optionLine(o, "off"))
			cur[o] = "off"
		}
	}
	funcsChanged := !slices.Equal(f[SectionFunctions], t[SectionFunctions]) || !slices.Equal(f[SectionFuncAttrs], t[SectionFuncAttrs])
	aliasesChanged := !slices.Equal(fAliases, tAliases)
	// Function text is read again: aliases must not expand in it.
	redoAliases := aliasesChanged || (funcsChanged && len(fAliases) > 0)
	if redoAliases {
		line(`\builtin unalias -a`)
	}
	if funcsChanged {
		for _, name := range sortedKeys(fFuncs) {
			line(`\builtin unset -f -- ` + shcmd.Quote(name))
		}
		// Function text written with extglob on may need it to parse.
		if cur["shopt:extglob"] != "on" {
			line(`\builtin shopt -s extglob`)
			cur["shopt:extglob"] = "on"
		}
		for _, l := range t[SectionFunctions] {
			line(l)
		}
		for _, name := range sortedKeys(tFuncs) {
			if a := tFuncs[name]; a != "-f" {
				line(`\builtin declare ` + a + ` -- ` + shcmd.Quote(name))
			}
		}
	}
	cwdChanged := !slices.Equal(f[SectionCwd], t[SectionCwd])
	if cwdChanged {
		c := t[SectionCwd]
		if len(c) != 2 || !strings.HasPrefix(c[0], "cwd=") || !strings.HasPrefix(c[1], "/") {
			return "", false // no physical path: a removed directory
		}
		// The logical path when it still leads there (the shell keeps it
		// as its directory, DIRSTACK[0]), else the physical one.
		logical, phys := shcmd.Quote(strings.TrimPrefix(c[0], "cwd=")), shcmd.Quote(c[1])
		line(`{ \builtin cd -L -- ` + logical + ` && [ "$(\builtin pwd -P)" = ` + phys + ` ]; } 2>/dev/null || \builtin cd -P -- ` + phys)
	}
	for _, name := range varOrder(fv, tv) {
		a, inF := fv[name]
		z, inT := tv[name]
		forced := cwdChanged && (name == "PWD" || name == "OLDPWD")
		if inF && inT && a.line == z.line && !forced {
			continue
		}
		if !settable(name) || (inF && strings.ContainsAny(a.flags, "rn")) || (inT && strings.ContainsAny(z.flags, "rn")) {
			return "", false // readonly and nameref variables cannot be re-made
		}
		if !inT {
			line(`\builtin unset -v -- ` + name)
			continue
		}
		if (inF && a.flags != z.flags) || !z.value || forced {
			line(`\builtin unset -v -- ` + name)
		}
		line(z.line)
	}
	if !slices.Equal(f[SectionDirs], t[SectionDirs]) {
		line(`\builtin dirs -c`)
		dirs := stackDirs(t[SectionDirs])
		for i := len(dirs) - 1; i >= 0; i-- {
			line(`\builtin pushd -n -- ` + shcmd.Quote(dirs[i]) + ` >/dev/null`)
		}
	}
	if !slices.Equal(f[SectionUmask], t[SectionUmask]) {
		u := t[SectionUmask]
		if len(u) != 1 || !umaskRe.MatchString(u[0]) {
			return "", false
		}
		line(`\builtin umask ` + u[0])
	}
	if redoAliases {
		for _, l := range tAliases {
			line(l)
		}
	}
	for _, o := range tOpts.order {
		v := tOpts.val[o]
		if _, ok := cur[o]; !ok {
			return "", false // an option only one side lists
		}
		if cur[o] == v {
			continue
		}
		if riskyOption[o] {
			return "", false
		}
		line(optionLine(o, v))
	}
	return b.String(), true
}

// variable is one declare -p line.
type variable struct {
	line  string
	flags string // "--", "-x", "-ai"...
	value bool   // has a value (declare -- X has none)
}

var declareRe = regexp.MustCompile(`^declare (-[-a-zA-Z]*) ([A-Za-z_][A-Za-z0-9_]*)(=|$)`)

func parseVars(lines []string) (map[string]variable, bool) {
	out := make(map[string]variable, len(lines))
	for _, l := range lines {
		m := declareRe.FindStringSubmatch(l)
		if m == nil {
			return nil, false // declare -p quotes control characters: one line each
		}
		out[m[2]] = variable{line: l, flags: m[1], value: m[3] == "="}
	}
	return out, true
}

// internalVars are left to others: Arbor writes __arbor_cmd around every
// command, the same way in the live and the restored shell; DIRSTACK,
// SHELLOPTS and BASHOPTS follow the directory stack and the options,
// which the script sets.
var internalVars = map[string]bool{"__arbor_cmd": true, "DIRSTACK": true, "SHELLOPTS": true, "BASHOPTS": true}

// safeVars refuses states whose variables a script cannot reproduce or
// whose prompt hooks run code between commands (the restored shell runs
// the delta and the query, the live one did not).
func safeVars(v map[string]variable) bool {
	for _, name := range []string{"PROMPT_COMMAND", "PS0"} {
		if x, ok := v[name]; ok && x.value && !strings.HasSuffix(x.line, `=""`) {
			return false
		}
	}
	for _, name := range []string{"PS1", "PS2", "PS4"} {
		if x, ok := v[name]; ok && (strings.Contains(x.line, "$(") || strings.Contains(x.line, "`")) {
			return false
		}
	}
	return true
}

// settable says whether a changed variable may be set by the script.
func settable(name string) bool {
	switch {
	case internalVars[name], dynamicVars[name]:
		return false
	case strings.HasPrefix(name, "BASH"), strings.HasPrefix(name, "COMP_"):
		return false
	case name == "GROUPS", name == "SHELLOPTS", name == "PPID", name == "UID", name == "EUID", name == "HISTCMD":
		return false
	}
	return true
}

// varOrder lists the names of both sides, sorted, without the internal
// ones, which are the same on both sides.
func varOrder(a, b map[string]variable) []string {
	var names []string
	for n := range a {
		names = append(names, n)
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return slices.DeleteFunc(names, func(n string) bool { return internalVars[n] })
}

var funcAttrRe = regexp.MustCompile(`^declare (-f[a-z]*) (.+)$`)

func parseFuncAttrs(lines []string) (map[string]string, bool) {
	out := make(map[string]string, len(lines))
	for _, l := range lines {
		m := funcAttrRe.FindStringSubmatch(l)
		if m == nil {
			return nil, false
		}
		out[m[2]] = m[1]
	}
	return out, true
}

func hasAlias(lines []string, name string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, "alias "+name+"=") {
			return true
		}
	}
	return false
}

// options are shopt -p and set -o, keyed "shopt:NAME" and "set:NAME".
type options struct {
	order []string
	val   map[string]string // "on" or "off"
}

var (
	shoptRe  = regexp.MustCompile(`^shopt -([su]) ([a-z_0-9]+)$`)
	setOptRe = regexp.MustCompile(`^([a-z-]+)\s+(on|off)$`)
	umaskRe  = regexp.MustCompile(`^[0-7]{3,4}$`)
)

func parseOptions(lines []string) (options, bool) {
	o := options{val: map[string]string{}}
	for _, l := range lines {
		var k, v string
		if m := shoptRe.FindStringSubmatch(l); m != nil {
			k, v = "shopt:"+m[2], map[string]string{"s": "on", "u": "off"}[m[1]]
		} else if m := setOptRe.FindStringSubmatch(l); m != nil {
			k, v = "set:"+m[1], m[2]
		} else {
			return o, false
		}
		if _, dup := o.val[k]; !dup {
			o.order = append(o.order, k)
		}
		o.val[k] = v
	}
	return o, true
}

func optionLine(key, v string) string {
	kind, name, _ := strings.Cut(key, ":")
	if kind == "shopt" {
		if v == "on" {
			return `\builtin shopt -s ` + name
		}
		return `\builtin shopt -u ` + name
	}
	if v == "on" {
		return `\builtin set -o ` + name
	}
	return `\builtin set +o ` + name
}

// riskyOption are options the script does not change: they change the
// terminal, job control, history or the shell's mode, or cannot be set.
var riskyOption = map[string]bool{
	"set:monitor": true, "set:emacs": true, "set:vi": true, "set:history": true, "set:privileged": true,
	"set:onecmd": true, "set:noexec": true, "set:posix": true, "set:interactive-comments": true,
	"shopt:login_shell": true, "shopt:restricted_shell": true,
}

// safeTraps refuses traps that run code around the script's own commands
// (DEBUG, RETURN, ERR): the restored shell would run them more often.
func safeTraps(lines []string) bool {
	for _, l := range lines {
		for _, sig := range []string{" DEBUG", " RETURN", " ERR"} {
			if strings.HasSuffix(l, sig) {
				return false
			}
		}
	}
	return true
}

// stackDirs reads the dirs section: printf prints one "dir=" for an empty
// stack.
func stackDirs(lines []string) []string {
	var out []string
	for _, l := range lines {
		if d, ok := strings.CutPrefix(l, "dir="); ok && d != "" {
			out = append(out, d)
		}
	}
	return out
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// Delta is a shell delta the Inspector found for a turn: the script that
// takes the shell of the last process image to the shell's state now,
// and the digest (ReadShell's, descriptors included) it must reach.
type Delta struct {
	Script string
	Digest string
}

// OnlyShellChanged reports whether the facts of a turn change the
// processes only through the managed shell's own state (its digest), so
// that a shell delta can stand for a process image: no process started,
// exited or ran, the shell could be read and compared with a digest, and
// nothing is unaccounted. Files may have changed.
func OnlyShellChanged(facts []Fact) bool {
	shell := false
	for _, f := range facts {
		switch f.Kind {
		case FileChanged:
		case ShellChanged:
			if f.Detail != "" {
				return false // no digest to compare with, or a shell that cannot list its functions
			}
			shell = true
		default:
			return false
		}
	}
	return shell
}
