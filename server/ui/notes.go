package ui

import (
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/state"
)

// Bounds of the turn log: what a view of the trees shows of a turn, not
// a transcript (the client has the whole result).
const (
	maxNotes      = 20000 // turns kept, oldest dropped first
	maxNoteCmd    = 1024  // bytes of a command kept
	maxNoteOutput = 256   // bytes of each of stdout and stderr kept
)

// TurnNote is what the web view remembers of one turn: the state
// records say which states exist, not which command made them. Text
// from the sandbox (Stdout, Stderr) is whatever the command printed: a
// view must escape it.
type TurnNote struct {
	Env   string `json:"env"`
	State string `json:"state"`
	// Parent is the env's state before the turn (State itself when the
	// turn took no checkpoint).
	Parent string `json:"parent"`
	// Turn counts the turns since the episode began; engineTurn is the
	// engine's count (the state records').
	Turn       int    `json:"turn"`
	engineTurn int    `json:"-"`
	Tool       string `json:"tool"`
	// Cmd is the command as asked (a bash command; "write_file PATH" or
	// "read_file PATH" for those tools; empty for a boundary), cut at
	// maxNoteCmd bytes (CmdCut).
	Cmd      string        `json:"cmd"`
	CmdCut   bool          `json:"cmd_cut,omitempty"`
	Exit     int           `json:"exit"`
	TimedOut bool          `json:"timed_out,omitempty"`
	Stdout   string        `json:"stdout,omitempty"`
	Stderr   string        `json:"stderr,omitempty"`
	Kind     string        `json:"kind"`
	Duration time.Duration `json:"duration_ns"`
	Time     time.Time     `json:"time"`
}

// notes is the bounded log of turns, by state: the one place a turn's
// command and exit code are recorded. It lives in memory (a restarted
// server shows the states it recovered without their commands). Its
// mutex is a leaf.
type notes struct {
	mu      sync.Mutex
	byState map[string][]*TurnNote
	byEnv   map[string]*TurnNote // each open env's newest
	ring    []*TurnNote          // oldest first once full, from next
	next    int
}

// add records the turn ev reports (an EventTurn) and returns a copy of
// its note.
func (n *notes) add(ev coordinator.Event) *TurnNote {
	r := ev.Ran
	t := &TurnNote{Env: ev.Env, State: ev.State, Parent: ev.Parent, Turn: ev.Turn, engineTurn: r.EngineTurn,
		Tool: r.Action.Tool, Exit: r.Exit, TimedOut: r.TimedOut, Kind: ev.Kind, Duration: r.Took, Time: ev.Time}
	t.Cmd, t.CmdCut = cut(display(r.Action), maxNoteCmd)
	t.Stdout, _ = cut(r.Stdout, maxNoteOutput) // only the head is copied
	t.Stderr, _ = cut(r.Stderr, maxNoteOutput)
	c := *t
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byState == nil {
		n.byState, n.byEnv = map[string][]*TurnNote{}, map[string]*TurnNote{}
	}
	n.byEnv[t.Env] = t
	if len(n.ring) < maxNotes {
		n.ring = append(n.ring, t)
	} else {
		old := n.ring[n.next]
		l := slices.DeleteFunc(n.byState[old.State], func(x *TurnNote) bool { return x == old })
		if len(l) == 0 {
			delete(n.byState, old.State)
		} else {
			n.byState[old.State] = l
		}
		n.ring[n.next] = t
		n.next = (n.next + 1) % maxNotes
	}
	n.byState[t.State] = append(n.byState[t.State], t)
	return &c
}

// of returns copies of the notes of the states ids, by state.
func (n *notes) of(ids map[string]bool) map[string][]TurnNote {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string][]TurnNote{}
	for id := range ids {
		for _, t := range n.byState[id] {
			out[id] = append(out[id], *t)
		}
	}
	return out
}

// latest returns a copy of the newest note of env (nil: none kept).
func (n *notes) latest(env string) *TurnNote {
	n.mu.Lock()
	defer n.mu.Unlock()
	t, ok := n.byEnv[env]
	if !ok {
		return nil
	}
	c := *t
	return &c
}

// forget drops env's newest note (it closed); its notes stay by state.
func (n *notes) forget(env string) {
	n.mu.Lock()
	delete(n.byEnv, env)
	n.mu.Unlock()
}

// display is how a note shows an action's command.
func display(a coordinator.Action) string {
	switch a.Tool {
	case state.ToolWriteFile:
		return "write_file " + a.Path
	case state.ToolReadFile:
		return "read_file " + a.Path
	}
	return a.Cmd
}

// cut keeps the first max bytes of s, on a rune boundary.
func cut[T string | []byte](s T, max int) (string, bool) {
	if len(s) <= max {
		return string(s), false
	}
	head := string(s[:max])
	// Back off a rune the cut split; invalid bytes before it stay (the
	// JSON encoder replaces them).
	for i := 1; i < utf8.UTFMax && i <= len(head); i++ {
		if utf8.RuneStart(head[len(head)-i]) {
			if !utf8.FullRuneInString(head[len(head)-i:]) {
				head = head[:len(head)-i]
			}
			break
		}
	}
	return head, true
}
