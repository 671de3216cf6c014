package ui

import (
	"sync"

	"github.com/arbor-env/arbor/coordinator"
)

// maxEnds bounds how many envs' ends the view remembers.
const maxEnds = 20000

// ends remembers how the envs handed out ended, from the coordinator's
// events (EventFinish, EventDiscard, EventClose, EventPromote for the
// child), so that the tree tells a finished leaf from a discarded and a
// closed one (docs/ui.md). It keeps the newest maxEnds in memory: an env that
// ended before the server started, or longer ago, is drawn as closed.
// Its mutex is a leaf, like the feed's.
type ends struct {
	mu   sync.Mutex
	by   map[string]string // env -> event type
	ring []string          // envs in the order they ended, oldest at next
	next int
}

// record notes the end an event reports, if it reports one, and returns
// the env that ended ("": none).
func (e *ends) record(ev coordinator.Event) string {
	env, end := ev.Env, ev.Type
	switch ev.Type {
	case coordinator.EventFinish, coordinator.EventDiscard, coordinator.EventClose:
	case coordinator.EventPromote:
		env = ev.Child
	default:
		return ""
	}
	if env == "" {
		return ""
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.by == nil {
		e.by = map[string]string{}
	}
	if _, ok := e.by[env]; !ok {
		if len(e.ring) < maxEnds {
			e.ring = append(e.ring, env)
		} else {
			delete(e.by, e.ring[e.next])
			e.ring[e.next] = env
			e.next = (e.next + 1) % maxEnds
		}
	}
	e.by[env] = end
	return env
}

// of is how env ended ("" when not known).
func (e *ends) of(env string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.by[env]
}
