package server

import (
	"strings"
	"testing"

	"github.com/arbor-env/arbor/server/protocol"
)

func keyedResult(sid, out string) *protocol.StepResult {
	return &protocol.StepResult{Obs: protocol.Obs{Stdout: protocol.Text(out)}, Info: protocol.Info{StateID: sid, Turn: 1}}
}

// TestStepKeysBounds: the record keeps the last keys of each env, a cap
// of keys in all and a budget of result bytes past which a key stays but
// its result goes (a retry is refused, not run again).
func TestStepKeysBounds(t *testing.T) {
	a := protocol.Action{Tool: protocol.ToolBash, Cmd: "ls"}
	k := newStepKeys(2, 5, 3000)
	k.record("e1", "k1", a, keyedResult("s1", "one"))
	res, err := k.lookup("e1", "k1", a)
	if err != nil || res == nil || !res.Info.Replayed || res.Obs.Stdout != "one" {
		t.Fatalf("lookup: %+v %v", res, err)
	}
	if res, err := k.lookup("e2", "k1", a); res != nil || err != nil {
		t.Fatalf("key of another env: %+v %v", res, err)
	}
	if _, err := k.lookup("e1", "k1", protocol.Action{Tool: protocol.ToolBash, Cmd: "pwd"}); err == nil || !strings.Contains(err.Error(), "another action") {
		t.Fatalf("same key, other action: %v", err)
	}
	// Per env: the third key pushes out the first.
	k.record("e1", "k2", a, keyedResult("s2", "two"))
	k.record("e1", "k3", a, keyedResult("s3", "three"))
	if res, _ := k.lookup("e1", "k1", a); res != nil {
		t.Fatal("k1 kept past the per-env bound")
	}
	if res, _ := k.lookup("e1", "k3", a); res == nil {
		t.Fatal("k3 lost")
	}
	// In all: 5 keys, the oldest go first.
	for _, e := range []string{"e2", "e3", "e4", "e5"} {
		k.record(e, "k", a, keyedResult("s", "x"))
	}
	if n, _ := k.len(); n != 5 {
		t.Fatalf("%d keys, want 5", n)
	}
	if res, _ := k.lookup("e1", "k2", a); res != nil {
		t.Fatal("oldest key kept past the global bound")
	}
	k.forget("e1")
	if n, _ := k.len(); n != 4 {
		t.Fatalf("%d keys after forgetting e1, want 4", n)
	}
	// Bytes: a big result pushes out the oldest results' bodies; their
	// keys stay and answer an error naming the state.
	k = newStepKeys(4, 100, 3000)
	k.record("e1", "k1", a, keyedResult("s1", "one"))
	k.record("e2", "k1", a, keyedResult("s2", "two"))
	k.record("e3", "big", a, keyedResult("s9", strings.Repeat("y", 2000)))
	if n, b := k.len(); b > 3000 || n != 3 {
		t.Fatalf("%d keys, %d bytes held, budget 3000", n, b)
	}
	_, err = k.lookup("e1", "k1", a)
	if err == nil || !strings.Contains(err.Error(), "no longer kept") || !strings.Contains(err.Error(), "s1") {
		t.Fatalf("dropped result: %v", err)
	}
	if res, err := k.lookup("e3", "big", a); err != nil || res == nil {
		t.Fatalf("newest result: %v", err)
	}
	k.forget("e3")
	if res, err := k.lookup("e3", "big", a); res != nil || err != nil {
		t.Fatal("forgotten env's key still answered")
	}
}
