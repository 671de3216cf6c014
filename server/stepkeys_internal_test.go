package server

import (
	"strings"
	"testing"

	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

func keyedResult(sid, out string) *protocol.StepResult {
	return &protocol.StepResult{Obs: protocol.Obs{Stdout: protocol.Text(out)}, Info: protocol.Info{StateID: sid, Turn: 1}}
}

// TestStepKeysBounds: the record keeps the last keys of each env, a cap
// of keys in all and a budget of result bytes past which a key stays but
// its result goes (a retry is refused, not run again).
func TestStepKeysBounds(t *testing.T) {
	a := protocol.Action{Tool: state.ToolBash, Cmd: "ls"}
	k := newStepKeys(2, 5, 3000)
	k.record("e1", "k1", a, keyedResult("s1", "one"))
	res, err := k.lookup("e1", "k1", a)
	if err != nil || res == nil || !res.Info.Replayed || res.Obs.Stdout != "one" {
		t.Fatalf("lookup: %+v %v", res, err)
	}
	if res, err := k.lookup("e2", "k1", a); res != nil || err != nil {
		t.Fatalf("key of another env: %+v %v", res, err)
	}
	if _, err := k.lookup("e1", "k1", protocol.Action{Tool: state.ToolBash, Cmd: "pwd"}); err == nil || !strings.Contains(err.Error(), "another action") {
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

// TestStepKeysTravel: an env's keys exported on one server and imported
// on another answer there as here, through the wire encoding; results
// past the byte bound travel without their bodies (a retry is refused,
// not run), as do results already dropped; a malformed record is
// refused; importing none forgets the env's keys.
func TestStepKeysTravel(t *testing.T) {
	a := protocol.Action{Tool: state.ToolBash, Cmd: "ls"}
	from := &Server{keys: newStepKeys(4, 100, 1<<20)}
	from.keys.record("e1", "k1", a, keyedResult("s1", "one\xff"))
	from.keys.record("e1", "k2", a, keyedResult("s2", strings.Repeat("z", 4000)))
	from.keys.record("e2", "k1", a, keyedResult("s9", "other env"))
	b, err := from.ExportStepKeys("e1")
	if err != nil {
		t.Fatal(err)
	}
	to := &Server{keys: newStepKeys(4, 100, 1<<20)}
	if err := to.ImportStepKeys("e1", b); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ key, out string }{{"k1", "one\xff"}, {"k2", strings.Repeat("z", 4000)}} {
		res, err := to.keys.lookup("e1", tt.key, a)
		if err != nil || res == nil || !res.Info.Replayed || string(res.Obs.Stdout) != tt.out {
			t.Errorf("%s after the move: %+v %v", tt.key, res, err)
		}
	}
	if res, err := to.keys.lookup("e2", "k1", a); res != nil || err != nil {
		t.Errorf("another env's key travelled: %+v %v", res, err)
	}
	if _, err := to.keys.lookup("e1", "k1", protocol.Action{Tool: state.ToolBash, Cmd: "pwd"}); err == nil || !strings.Contains(err.Error(), "another action") {
		t.Errorf("same key, other action after the move: %v", err)
	}
	// Over the bound: the newest result goes, the older one without its body.
	recs := from.keys.export("e1", 4600)
	if len(recs) != 2 || recs[0].Result != nil || recs[1].Result == nil {
		t.Fatalf("export under 4600 bytes: %+v", recs)
	}
	if err := to.keys.replace("e1", recs); err != nil {
		t.Fatal(err)
	}
	if _, err := to.keys.lookup("e1", "k1", a); err == nil || !strings.Contains(err.Error(), "no longer kept") || !strings.Contains(err.Error(), "s1") {
		t.Errorf("a key that travelled without its result: %v", err)
	}
	if err := to.keys.replace("e1", []keyRecord{{Key: "k", Action: []byte("short")}}); err == nil {
		t.Error("a malformed record was taken")
	}
	if err := to.ImportStepKeys("e1", []byte{0xc1}); err == nil {
		t.Error("a malformed encoding was taken")
	}
	if err := to.ImportStepKeys("e1", nil); err != nil {
		t.Fatal(err)
	}
	if res, err := to.keys.lookup("e1", "k2", a); res != nil || err != nil {
		t.Errorf("keys kept after importing none: %+v %v", res, err)
	}
}
