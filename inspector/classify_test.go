package inspector

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/state"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name   string
		facts  []Fact
		want   state.Kind
		paths  []string
		reason string
	}{
		{name: "nothing", want: state.None},
		{name: "file", facts: []Fact{{Kind: FileChanged, Path: "/work/a"}, {Kind: FileChanged, Path: "/work/a"}}, want: state.FS, paths: []string{"/work/a"}, reason: "file /work/a changed"},
		{name: "process exited", facts: []Fact{{Kind: ProcExited, PID: 12}}, want: state.Proc, reason: "process 12 exited"},
		{name: "shell", facts: []Fact{{Kind: ShellChanged}}, want: state.Proc, reason: "shell state changed"},
		{name: "file and process", facts: []Fact{{Kind: FileChanged, Path: "/b"}, {Kind: ProcStarted, PID: 3}}, want: state.Full},
		{name: "lost events", facts: []Fact{{Kind: Unaccounted, Detail: "lost events (3)"}}, want: state.Full, reason: "lost events (3) -> full"},
		{name: "unknown fact", facts: []Fact{{Kind: 99}}, want: state.Full},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Classify(tt.facts)
			if r.Kind != tt.want {
				t.Errorf("kind %s, want %s (%v)", r.Kind, tt.want, r.Reasons)
			}
			if tt.paths != nil && !slices.Equal(r.Paths, tt.paths) {
				t.Errorf("paths %v, want %v", r.Paths, tt.paths)
			}
			if tt.reason != "" && !slices.Contains(r.Reasons, tt.reason) {
				t.Errorf("reasons %q lack %q", r.Reasons, tt.reason)
			}
		})
	}
}

func TestClassifyBoundsReasons(t *testing.T) {
	var facts []Fact
	for i := 0; i < 100; i++ {
		facts = append(facts, Fact{Kind: ProcRan, PID: i})
	}
	r := Classify(facts)
	if len(r.Reasons) != MaxReasons+1 || !strings.Contains(r.Reasons[MaxReasons], "68 more") {
		t.Errorf("reasons: %d, last %q", len(r.Reasons), r.Reasons[len(r.Reasons)-1])
	}
}

func TestCompareProcs(t *testing.T) {
	a := ProcSample{ProcKey: ProcKey{PID: 10, Start: 5}, Comm: "sleep", Threads: 1, Runtime: time.Millisecond, Returns: 4, HasReturns: true}
	mod := func(f func(*ProcSample)) ProcSample { p := a; f(&p); return p }
	tests := []struct {
		name      string
		base, now []ProcSample
		precise   bool
		want      []FactKind
	}{
		{name: "idle", base: []ProcSample{a}, now: []ProcSample{a}, precise: true},
		{name: "freeze and thaw only", base: []ProcSample{a}, now: []ProcSample{mod(func(p *ProcSample) { p.Runtime += 30 * time.Microsecond })}, precise: true},
		{name: "freeze and thaw without eBPF", base: []ProcSample{a}, now: []ProcSample{mod(func(p *ProcSample) { p.Runtime += 30 * time.Microsecond })}, want: []FactKind{ProcRan}},
		{name: "syscalls returned", base: []ProcSample{a}, now: []ProcSample{mod(func(p *ProcSample) { p.Returns++ })}, precise: true, want: []FactKind{ProcRan}},
		{name: "busy", base: []ProcSample{a}, now: []ProcSample{mod(func(p *ProcSample) { p.Runtime += time.Second })}, precise: true, want: []FactKind{ProcRan}},
		{name: "running at checkpoint", base: []ProcSample{mod(func(p *ProcSample) { p.Running = true })}, now: []ProcSample{a}, precise: true, want: []FactKind{ProcRan}},
		{name: "new", now: []ProcSample{a}, want: []FactKind{ProcStarted}},
		{name: "exited", base: []ProcSample{a}, want: []FactKind{ProcExited}},
		{name: "zombie", base: []ProcSample{a}, now: []ProcSample{mod(func(p *ProcSample) { p.Zombie = true })}, precise: true, want: []FactKind{ProcExited}},
		{name: "pid reused", base: []ProcSample{a}, now: []ProcSample{mod(func(p *ProcSample) { p.Start++ })}, precise: true, want: []FactKind{ProcStarted, ProcExited}},
		{name: "shared mapping and ran", base: []ProcSample{a}, now: []ProcSample{mod(func(p *ProcSample) { p.Returns++; p.SharedWritable = []string{"/db"} })}, precise: true, want: []FactKind{ProcRan, Unaccounted}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []FactKind
			for _, f := range CompareProcs(tt.base, tt.now, tt.precise) {
				got = append(got, f.Kind)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("facts %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNormalizeShellState(t *testing.T) {
	a := NormalizeShellState([]byte("shell=bash\ndeclare -- _=\"x\"\ndeclare -i LINENO=\"3\"\ndeclare -x HOME=\"/root\"\ncwd=/root\npid=7\n"))
	b := NormalizeShellState([]byte("shell=bash\ndeclare -- _=\"y\"\ndeclare -i LINENO=\"9\"\ndeclare -x HOME=\"/root\"\ncwd=/root\npid=7\n"))
	c := NormalizeShellState([]byte("shell=bash\ndeclare -x HOME=\"/root\"\ncwd=/tmp\npid=7\n"))
	if a.Digest != b.Digest {
		t.Error("dynamic variables changed the digest")
	}
	if a.Digest == c.Digest {
		t.Error("a new cwd left the digest alone")
	}
	if a.PID != 7 || !a.Bash {
		t.Errorf("pid %d bash %v", a.PID, a.Bash)
	}
	sh := NormalizeShellState([]byte("shell=sh\n_='x'\nRANDOM='1'\nPATH='/bin'\npid=3\n"))
	sh2 := NormalizeShellState([]byte("shell=sh\n_='y'\nRANDOM='2'\nPATH='/bin'\npid=3\n"))
	if sh.Digest != sh2.Digest || sh.Bash {
		t.Error("ash dynamic variables changed the digest")
	}
}

func TestMayDefineFunction(t *testing.T) {
	for cmd, want := range map[string]bool{
		"ls -la":                false,
		"f() { echo hi; }":      true,
		"function g { :; }":     true,
		". ./env.sh":            true,
		"cd /tmp && source x":   true,
		"echo $(date)":          false,
		"grep -r 'foo(' src":    false,
		"eval \"$(ssh-agent)\"": true,
	} {
		if got := MayDefineFunction(cmd); got != want {
			t.Errorf("MayDefineFunction(%q) = %v, want %v", cmd, got, want)
		}
	}
}
