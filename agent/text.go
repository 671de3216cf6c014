package agent

import (
	"fmt"
	"strings"
)

// The tools' descriptions, written for the model that reads them.
const (
	descBash = `Run a shell command in your sandbox's persistent shell and return its stdout, stderr and exit code.
The shell keeps its state between calls: the current directory, exported and shell variables, functions and background jobs carry over.
Every call that can change something is saved as a state you can return to later with rollback; the result names that state (state_id, turn).
Use it for everything you would type at a terminal: building, testing, editing with sed, installing, running programs.
A command that runs longer than timeout_s (default 60) is killed; the shell itself survives.`

	descReadFile = `Read a file and return its content as text. It changes nothing and makes no new state.
Relative paths start at the shell's current directory. Large files come back with the middle cut out (truncated is set).`

	descWriteFile = `Create or overwrite a file with exactly the given content (missing parent directories are created).
Relative paths start at the shell's current directory. Like bash, the call is saved as a state you can roll back to.
Prefer it to echo/heredocs for writing source files: nothing gets mangled by shell quoting.`

	descListStates = `List your recent states in the order they were made: for each, its state_id, the turn, the tool call and command that produced it, its exit code, and whether it can still be restored.
"current" marks the state the sandbox is in now; "undone" marks states a rollback went back past (they can still be restored).
Call it when something went wrong and you want to find the last good point to return to.`

	descRollback = `Return the whole sandbox to an earlier state: files, running processes and the shell's state (directory, variables) become exactly what they were right after the call that produced that state.
Use it when you broke something and undoing it by hand would be slow or uncertain: a build that no longer compiles, deleted or overwritten files, a botched refactor, a corrupted database, a process you killed.
Take state_id from list_states (or from an earlier bash/write_file result). Only states of your own history can be restored.
Nothing is lost: the states after it stay listed and you can roll forward to them again.`

	descForkTry = `Try a command on a throwaway copy of your sandbox and report what it did: stdout, stderr, exit code, and the list of files it added, modified or deleted.
It has no side effects: your sandbox (files, processes, shell state) stays exactly as it is, whatever the command does, and no state is made.
Use it to preview risky or destructive commands (rm, migrations, "make clean", a script you do not trust), to check whether a fix builds before applying it, or to see what a command would touch.
To keep the effect, run the command again with bash.`
)

// text renders a result for the model to read; the structured form goes
// alongside it.
func (r *BashResult) text(a BashArgs) string {
	var b strings.Builder
	fmt.Fprintf(&b, "$ %s\n", firstLine(a.Cmd))
	writeStreams(&b, r.Stdout, r.Stderr)
	fmt.Fprintf(&b, "[exit code %d", r.ExitCode)
	if r.TimedOut {
		b.WriteString(", timed out")
	}
	if r.Truncated {
		b.WriteString(", output truncated")
	}
	fmt.Fprintf(&b, " · %.2f s · cwd %s · state %s (turn %d)]", r.DurationS, r.Cwd, r.StateID, r.Turn)
	if r.ShellRestarted {
		b.WriteString("\n[the command ended the shell; a fresh shell took its place (variables and functions are gone)]")
	}
	if r.Warning != "" {
		b.WriteString("\n[warning: " + r.Warning + "]")
	}
	return b.String()
}

func (r *ReadFileResult) text(ReadFileArgs) string {
	s := r.Content
	if r.Truncated {
		s += fmt.Sprintf("\n[truncated: the file has %d bytes; its head and tail are shown]", r.Bytes)
	}
	return s
}

func (r *WriteFileResult) text(WriteFileArgs) string {
	s := fmt.Sprintf("wrote %d bytes to %s · state %s (turn %d)", r.Bytes, r.Path, r.StateID, r.Turn)
	if r.Warning != "" {
		s += "\n[warning: " + r.Warning + "]"
	}
	return s
}

func (r *ListStatesResult) text(ListStatesArgs) string {
	var b strings.Builder
	fmt.Fprintf(&b, "env %s, now at turn %d, state %s\n", r.EnvID, r.Turn, r.Current)
	if r.Older > 0 {
		fmt.Fprintf(&b, "(%d older states not shown; pass a larger limit)\n", r.Older)
	}
	b.WriteString("turn  state_id        restorable  exit  command\n")
	for _, s := range r.States {
		restorable := "yes"
		if !s.Restorable {
			restorable = "NO"
		}
		exit := fmt.Sprint(s.ExitCode)
		if s.Tool == "" {
			exit = "-"
		}
		marks := ""
		if s.Current {
			marks += "  <- current"
		}
		if s.Undone {
			marks += "  (undone by a rollback)"
		}
		if s.Note != "" {
			marks += "  (" + s.Note + ")"
		}
		cmd := firstLine(s.Command)
		if s.Tool == "bash" {
			cmd = "$ " + cmd
		}
		fmt.Fprintf(&b, "%4d  %-14s  %-10s  %4s  %s%s\n", s.Turn, s.StateID, restorable, exit, cmd, marks)
	}
	return strings.TrimRight(b.String(), "\n")
}

func (r *RollbackResult) text(RollbackArgs) string {
	what := r.Command
	if r.Tool == "bash" {
		what = "$ " + firstLine(what)
	}
	s := fmt.Sprintf("rolled back to state %s (turn %d, right after: %s) in %.2f s.\nFiles, processes and shell state are as they were then", r.StateID, r.Turn, what, r.DurationS)
	if r.Cwd != "" {
		s += "; cwd " + r.Cwd
	}
	s += "."
	if r.Undone > 0 {
		s += fmt.Sprintf(" %d later state(s) were undone; they stay in list_states and can be restored.", r.Undone)
	}
	return s
}

func (r *ForkTryResult) text(a ForkTryArgs) string {
	var b strings.Builder
	fmt.Fprintf(&b, "(on a throwaway copy of state %s; your sandbox is unchanged)\n$ %s\n", r.FromState, firstLine(a.Cmd))
	writeStreams(&b, r.Stdout, r.Stderr)
	fmt.Fprintf(&b, "[exit code %d", r.ExitCode)
	if r.TimedOut {
		b.WriteString(", timed out")
	}
	fmt.Fprintf(&b, " · %.2f s · cwd %s]\n", r.DurationS, r.Cwd)
	switch {
	case r.Changes == nil:
		b.WriteString("files changed: unknown (" + r.ChangesNote + ")")
	case len(r.Changes) == 0:
		b.WriteString("files changed: none")
	default:
		fmt.Fprintf(&b, "files changed (%d):", len(r.Changes))
		for _, c := range r.Changes {
			mark := map[string]string{"added": "A", "modified": "M", "deleted": "D"}[c.Kind]
			fmt.Fprintf(&b, "\n  %s %s", mark, c.Path)
		}
		if r.ChangesTruncated {
			b.WriteString("\n  … " + r.ChangesNote)
		}
	}
	return b.String()
}

func writeStreams(b *strings.Builder, stdout, stderr string) {
	if stdout != "" {
		b.WriteString(stdout)
		if !strings.HasSuffix(stdout, "\n") {
			b.WriteString("\n")
		}
	}
	if stderr != "" {
		b.WriteString("[stderr]\n" + stderr)
		if !strings.HasSuffix(stderr, "\n") {
			b.WriteString("\n")
		}
	}
}

// firstLine shortens a command to its first line (and 200 bytes) for
// one-line displays.
func firstLine(s string) string {
	more := false
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s, more = s[:i], true
	}
	if len(s) > 200 {
		s, more = s[:200], true
	}
	if more {
		s += " …"
	}
	return s
}
