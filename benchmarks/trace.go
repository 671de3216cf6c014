package benchmarks

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

//go:embed traces
var embedded embed.FS

// Action is one agent action of a trace: a bash command, a file write or
// a file read (the protocol's step tools).
type Action struct {
	Bash      string `yaml:"bash,omitempty" json:"bash,omitempty"`
	WriteFile string `yaml:"write_file,omitempty" json:"write_file,omitempty"`
	Content   string `yaml:"content,omitempty" json:"-"`
	// ContentFile names a file next to the trace whose text is Content.
	ContentFile string `yaml:"content_file,omitempty" json:"-"`
	ReadFile    string `yaml:"read_file,omitempty" json:"read_file,omitempty"`
	// Expect is the class the trace's author expects the turn to have
	// (none, fs, proc, full); the report compares it with the observed one.
	Expect string `yaml:"expect,omitempty" json:"expect,omitempty"`
}

// Label is a short human-readable form of the action.
func (a Action) Label() string {
	switch {
	case a.WriteFile != "":
		return "write_file " + a.WriteFile
	case a.ReadFile != "":
		return "read_file " + a.ReadFile
	}
	s := strings.Join(strings.Fields(a.Bash), " ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

// Trace is a recorded agent session: setup actions (the task's starting
// point, not counted as agent turns) and the agent's turns.
type Trace struct {
	Name        string   `yaml:"name" json:"name"`
	Description string   `yaml:"description" json:"description"`
	Image       string   `yaml:"image" json:"image"`
	Setup       []Action `yaml:"setup" json:"-"`
	Turns       []Action `yaml:"turns" json:"-"`
}

// All returns setup and turns in order: the actions a replay re-runs.
func (t Trace) All() []Action { return append(append([]Action(nil), t.Setup...), t.Turns...) }

func (a *Action) check(i int) error {
	n := 0
	for _, s := range []string{a.Bash, a.WriteFile, a.ReadFile} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("action %d: want exactly one of bash, write_file, read_file", i)
	}
	switch a.Expect {
	case "", "none", "fs", "proc", "full":
	default:
		return fmt.Errorf("action %d: expect %q is not none, fs, proc or full", i, a.Expect)
	}
	return nil
}

// ParseTrace reads a trace; readFile resolves content_file names.
func ParseTrace(data []byte, readFile func(name string) ([]byte, error)) (Trace, error) {
	var t Trace
	if err := yaml.Unmarshal(data, &t); err != nil {
		return t, fmt.Errorf("%w: %v", ErrBadTrace, err)
	}
	if t.Name == "" || len(t.Turns) == 0 {
		return t, fmt.Errorf("%w: a trace needs a name and turns", ErrBadTrace)
	}
	if t.Image == "" {
		t.Image = "debian"
	}
	for _, list := range [][]Action{t.Setup, t.Turns} {
		for i := range list {
			a := &list[i]
			if err := a.check(i); err != nil {
				return t, fmt.Errorf("%w: %s: %v", ErrBadTrace, t.Name, err)
			}
			if a.ContentFile != "" {
				b, err := readFile(a.ContentFile)
				if err != nil {
					return t, fmt.Errorf("%w: %s: content_file: %v", ErrBadTrace, t.Name, err)
				}
				a.Content = string(b)
			}
		}
	}
	return t, nil
}

// LoadTraces reads every *.yaml trace of dir, or the traces built into
// the binary when dir is empty, sorted by name. only, when not empty,
// keeps the named ones.
func LoadTraces(dir string, only []string) ([]Trace, error) {
	var fsys fs.FS = embedded
	root := "traces"
	if dir != "" {
		fsys, root = os.DirFS(dir), "."
	}
	names, err := fs.Glob(fsys, path.Join(root, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var out []Trace
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		t, err := ParseTrace(b, func(name string) ([]byte, error) {
			return fs.ReadFile(fsys, path.Join(root, filepath.ToSlash(name)))
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		if len(only) > 0 && !contains(only, t.Name) {
			continue
		}
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no traces found", ErrBadTrace)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
