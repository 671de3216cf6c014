package coordinator

import "time"

// Event types: the changes the coordinator reports to its Observer.
const (
	EventReset    = "reset"
	EventTurn     = "turn"
	EventBranch   = "branch"
	EventRollback = "rollback"
	EventPromote  = "promote"
	EventDiscard  = "discard"
	EventClose    = "close"
	// EventEvaluate: an env's state was evaluated (Reward); the env goes
	// on. EventFinish: an env was evaluated (Reward, absent when the
	// evaluation failed) and closed, its episode over.
	EventEvaluate = "evaluate"
	EventFinish   = "finish"
)

// Event is one change to the envs handed out or their lineage (its JSON
// is the web view's, package server/ui, which adds a sequence number and
// a turn's note).
type Event struct {
	Type string    `json:"type"`
	Time time.Time `json:"time"`
	Env  string    `json:"env,omitempty"`
	Task string    `json:"task,omitempty"`
	// State is the env's state after the event (a reset's, a turn's, a
	// rollback's target, a promote's adopted one; a branch's source state).
	State string `json:"state,omitempty"`
	// Parent is the state a turn started from (State itself for a turn
	// that took no checkpoint).
	Parent string `json:"parent,omitempty"`
	Kind   string `json:"kind,omitempty"`
	Turn   int    `json:"turn"`
	// Children are a branch's new envs; Child is a promote's (closed).
	Children []string `json:"children,omitempty"`
	Child    string   `json:"child,omitempty"`
	// Reward is an evaluate's or a finish's.
	Reward *float64 `json:"reward,omitempty"`
	// Ran is a turn's command and outcome.
	Ran *Ran `json:"-"`
}

// Ran is what a turn ran and how it went.
type Ran struct {
	Action     Action // Tool "boundary" for a boundary
	EngineTurn int    // the engine's turn count (the state records')
	Exit       int
	TimedOut   bool
	Stdout     []byte
	Stderr     []byte
	Took       time.Duration
}

// Observer hears of every change, in order, synchronously and with no
// lock of the coordinator held: it must not block. Close: the
// coordinator closed.
type Observer interface {
	Observe(Event)
	Close()
}

// SetObserver makes o the one observer of c's changes (the web view's
// read models, package server/ui).
func (c *Coordinator) SetObserver(o Observer) { c.observer.Store(&o) }

func (c *Coordinator) publish(ev Event) {
	if o := c.observer.Load(); o != nil {
		(*o).Observe(ev)
	}
}

// noteTurn reports a turn that ended (Turn, Boundary).
func (c *Coordinator) noteTurn(m *entry, a Action, parent string, out *TurnResult, took time.Duration) {
	ran := &Ran{Action: a, EngineTurn: out.Turn + m.base, Took: took}
	if r := out.Result; r != nil {
		ran.Exit, ran.TimedOut, ran.Stdout, ran.Stderr = r.ExitCode, r.TimedOut, r.Stdout, r.Stderr
	}
	c.publish(Event{Type: EventTurn, Time: time.Now(), Env: out.Env.ID, Task: m.task.Name, State: out.StateID, Parent: parent,
		Kind: string(out.Kind), Turn: out.Turn, Ran: ran})
}
