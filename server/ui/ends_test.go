package ui

import (
	"fmt"
	"testing"

	"github.com/arbor-env/arbor/coordinator"
)

// TestEndsBounded: the feed remembers how each env ended (a promote's
// child, not its origin; a turn is no end), the newest maxEnds of them,
// and the tree's status follows: finished, discarded, else closed.
func TestEndsBounded(t *testing.T) {
	var e ends
	for _, ev := range []coordinator.Event{
		{Type: coordinator.EventFinish, Env: "f"}, {Type: coordinator.EventDiscard, Env: "d"}, {Type: coordinator.EventClose, Env: "c"},
		{Type: coordinator.EventPromote, Env: "origin", Child: "p"}, {Type: coordinator.EventTurn, Env: "t"}, {Type: coordinator.EventEvaluate, Env: "v"},
	} {
		e.record(ev)
	}
	for _, tt := range []struct{ env, end, status string }{
		{"f", coordinator.EventFinish, StatusFinished}, {"d", coordinator.EventDiscard, StatusDiscarded}, {"c", coordinator.EventClose, StatusClosed},
		{"p", coordinator.EventPromote, StatusClosed}, {"origin", "", StatusClosed}, {"t", "", StatusClosed}, {"v", "", StatusClosed},
	} {
		if got := e.of(tt.env); got != tt.end || endStatus(got) != tt.status {
			t.Errorf("env %s: end %q status %s, want %q %s", tt.env, got, endStatus(got), tt.end, tt.status)
		}
	}
	for i := range maxEnds {
		e.record(coordinator.Event{Type: coordinator.EventClose, Env: fmt.Sprint("e", i)})
	}
	if len(e.by) != maxEnds || len(e.ring) != maxEnds {
		t.Fatalf("%d ends remembered (ring %d), want %d", len(e.by), len(e.ring), maxEnds)
	}
	if e.of("f") != "" || e.of("p") != "" || e.of("e0") != coordinator.EventClose || e.of(fmt.Sprint("e", maxEnds-1)) != coordinator.EventClose {
		t.Errorf("after %d more: the oldest kept, or the newest forgotten", maxEnds)
	}
	e.record(coordinator.Event{Type: coordinator.EventFinish, Env: "e5"}) // known: updated in place
	e.record(coordinator.Event{Type: coordinator.EventDiscard, Env: "new"})
	if e.of("e0") != "" || e.of("e5") != coordinator.EventFinish || e.of("new") != coordinator.EventDiscard || len(e.by) != maxEnds {
		t.Errorf("e0 %q, e5 %q, new %q, %d remembered", e.of("e0"), e.of("e5"), e.of("new"), len(e.by))
	}
}
