package coordinator

import (
	"fmt"
	"testing"
)

// TestEndsBounded: the feed remembers how each env ended (a promote's
// child, not its origin; a turn is no end), the newest maxEnds of them,
// and the tree's status follows: finished, discarded, else closed.
func TestEndsBounded(t *testing.T) {
	var e ends
	for _, ev := range []Event{
		{Type: EventFinish, Env: "f"}, {Type: EventDiscard, Env: "d"}, {Type: EventClose, Env: "c"},
		{Type: EventPromote, Env: "origin", Child: "p"}, {Type: EventTurn, Env: "t"}, {Type: EventEvaluate, Env: "v"},
	} {
		e.record(ev)
	}
	for _, tt := range []struct{ env, end, status string }{
		{"f", EventFinish, StatusFinished}, {"d", EventDiscard, StatusDiscarded}, {"c", EventClose, StatusClosed},
		{"p", EventPromote, StatusClosed}, {"origin", "", StatusClosed}, {"t", "", StatusClosed}, {"v", "", StatusClosed},
	} {
		if got := e.of(tt.env); got != tt.end || endStatus(got) != tt.status {
			t.Errorf("env %s: end %q status %s, want %q %s", tt.env, got, endStatus(got), tt.end, tt.status)
		}
	}
	for i := range maxEnds {
		e.record(Event{Type: EventClose, Env: fmt.Sprint("e", i)})
	}
	if len(e.by) != maxEnds || len(e.ring) != maxEnds {
		t.Fatalf("%d ends remembered (ring %d), want %d", len(e.by), len(e.ring), maxEnds)
	}
	if e.of("f") != "" || e.of("p") != "" || e.of("e0") != EventClose || e.of(fmt.Sprint("e", maxEnds-1)) != EventClose {
		t.Errorf("after %d more: the oldest kept, or the newest forgotten", maxEnds)
	}
	e.record(Event{Type: EventFinish, Env: "e5"}) // known: updated in place
	e.record(Event{Type: EventDiscard, Env: "new"})
	if e.of("e0") != "" || e.of("e5") != EventFinish || e.of("new") != EventDiscard || len(e.by) != maxEnds {
		t.Errorf("e0 %q, e5 %q, new %q, %d remembered", e.of("e0"), e.of("e5"), e.of("new"), len(e.by))
	}
}
