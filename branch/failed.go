package branch

import (
	"errors"
	"fmt"
	"sync"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// failedStates remembers why the checkpoints of recent states failed: a
// step hands out its state id before its background checkpoint runs, and
// a branch of that id must say why the state never came to be (the
// agent's doing or the server's), not only that it is unknown
// (docs/protocol.md, Errors). Bounded: the oldest failures are forgotten
// first, and their ids are then merely unknown. Its mutex is a leaf.
type failedStates struct {
	mu    sync.Mutex
	errs  map[string]error
	order []string // oldest first
}

// maxFailedStates bounds failedStates: a failure is kept at least until
// that many others came after it.
const maxFailedStates = 4096

func (f *failedStates) add(sid string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.errs == nil {
		f.errs = map[string]error{}
	}
	if _, ok := f.errs[sid]; !ok {
		f.order = append(f.order, sid)
	}
	f.errs[sid] = err
	for len(f.order) > maxFailedStates {
		delete(f.errs, f.order[0])
		f.order = f.order[1:]
	}
}

func (f *failedStates) get(sid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errs[sid]
}

// StateFailure returns why the checkpoint of state sid failed, when it
// did (recently); nil otherwise. The error wraps state.ErrCheckpoint and, when
// the sandbox's own state was the cause, cr.ErrAgentState,
// sandbox.ErrBroken or state.ErrUnrestorableState.
func (e *Engine) StateFailure(sid string) error { return e.failed.get(sid) }

// agentCaused reports whether err blames the sandbox's own processes or
// the state they hold (state.ErrUnrestorableState: no restore could bring
// it back), so that the cause stays testable.
func agentCaused(err error) bool {
	return errors.Is(err, cr.ErrAgentState) || errors.Is(err, sandbox.ErrBroken) || errors.Is(err, state.ErrUnrestorableState)
}

// unknownState is the error of a look-up of sid that the manifest does
// not have: state.ErrUnknownState, wrapping its checkpoint's failure when that
// is why.
func (e *Engine) unknownState(sid string) error {
	if ferr := e.failed.get(sid); ferr != nil {
		return fmt.Errorf("%w: %s never came to be: %w", state.ErrUnknownState, sid, ferr)
	}
	return fmt.Errorf("%w: %s", state.ErrUnknownState, sid)
}
