package ui

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/state"
)

// TestFeedDropsSlowSubscriber: publishing never waits for a reader; a
// subscriber whose buffer is full is dropped (its channel closed,
// Dropped set) while the others get every event, in order.
func TestFeedDropsSlowSubscriber(t *testing.T) {
	var f feed
	slow, fast := f.subscribe(2), f.subscribe(10)
	gone := f.subscribe(1)
	gone.Close()
	if _, ok := <-gone.C; ok || gone.Dropped() {
		t.Fatalf("a closed subscription: channel open or dropped")
	}
	done := make(chan struct{})
	go func() {
		for i := range 5 {
			f.publish(Event{Event: coordinator.Event{Type: coordinator.EventTurn, Turn: i}})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("publish blocked on a subscriber that does not read")
	}
	var got []int
	for ev := range fast.C {
		got = append(got, ev.Turn)
		if len(got) == 5 {
			break
		}
	}
	if !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Errorf("fast subscriber got turns %v", got)
	}
	n := 0
	for range slow.C {
		n++
	}
	if n != 2 || !slow.Dropped() {
		t.Errorf("slow subscriber: %d events before its channel closed (want 2), dropped %v", n, slow.Dropped())
	}
	f.close()
	if _, ok := <-fast.C; ok {
		t.Error("the coordinator's close left a subscription open")
	}
	if s := f.subscribe(1); s != nil {
		if _, ok := <-s.C; ok {
			t.Error("a subscription after close is open")
		}
	}
}

// TestTreeAndFeed: an env's turns (fs, none, proc), a rollback, a new
// path, a branch into two children, one child's discard: the feed says
// each in order, and the tree has every state the engine made and the
// turns without a checkpoint, with the statuses, branch edges, heads and
// commands they should have.
func TestTreeAndFeed(t *testing.T) {
	k := &kinds{next: []state.Kind{state.FS, state.None, state.Proc, state.FS, state.Full, state.FS}}
	c, l := newLocal(t, coordinator.Options{Classify: k.classify})
	sub := l.feed.subscribe(100)
	defer sub.Close()
	ctx := context.Background()
	r := reset(t, c, coordinator.ResetRequest{Image: "busybox"})
	env := r.Env.ID
	t.Cleanup(func() { c.CloseEnv(context.Background(), env) })
	t1 := bash(t, c, env, "echo a > /tmp/f")
	t2 := bash(t, c, env, "cat /tmp/f; echo '<b>' >&2; false")
	t3 := bash(t, c, env, "sleep 1000 &")
	if _, err := c.Rollback(ctx, env, t1.StateID); err != nil {
		t.Fatal(err)
	}
	t4 := bash(t, c, env, "echo b > /tmp/f")
	br, err := c.Branch(ctx, coordinator.BranchRequest{EnvID: env, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, b := br.Children[0].ID, br.Children[1].ID
	t.Cleanup(func() { c.CloseEnv(context.Background(), a) })
	// Before their first turn the children have made no state: their
	// heads are the branch state, which the tree shows with their rings.
	early, err := l.Tree(context.Background(), TreeScope{Env: b})
	if err != nil {
		t.Fatal(err)
	}
	var heads []string
	for _, n := range early.Nodes {
		if n.ID == br.State {
			heads = n.Heads
		}
	}
	slices.Sort(heads)
	if want := []string{a, b, env}; !slices.Equal(heads, slices.Sorted(slices.Values(want))) {
		t.Errorf("heads on the branch state before the children's turns: %v, want %v", heads, want)
	}
	ta := bash(t, c, a, "echo c > /tmp/f")
	tb := bash(t, c, b, "echo d > /tmp/f")
	// The rig's engine retains nothing after a close (Retain 0), so the
	// background GC may drop b's state, and then b's record, at any moment
	// after the discard; the pin keeps them for the checks of a discarded
	// state below (it failed 1 run in 15 without it).
	if err := c.Pin(ctx, []string{tb.StateID}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Unpin(context.Background(), []string{tb.StateID}) })
	if err := c.Discard(ctx, b); err != nil {
		t.Fatal(err)
	}
	if t2.StateID != t1.StateID || t2.Kind != state.None {
		t.Fatalf("the read-only turn: state %s kind %s, want %s none", t2.StateID, t2.Kind, t1.StateID)
	}

	var types []string
	for len(sub.C) > 0 {
		ev := <-sub.C
		types = append(types, ev.Type)
		if ev.Type == coordinator.EventTurn && ev.State == t2.StateID && ev.Kind == "none" {
			if ev.Note == nil || ev.Note.Exit != 1 || ev.Note.Cmd != "cat /tmp/f; echo '<b>' >&2; false" || ev.Note.Stderr != "<b>\n" || ev.Parent != t1.StateID {
				t.Errorf("the none turn's event: %+v note %+v", ev, ev.Note)
			}
		}
	}
	want := []string{"reset", "turn", "turn", "turn", "rollback", "turn", "branch", "turn", "turn", "discard"}
	if !slices.Equal(types, want) {
		t.Errorf("events %v, want %v", types, want)
	}

	tree, err := l.Tree(context.Background(), TreeScope{Env: a})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]TreeNode{}
	for _, n := range tree.Nodes {
		nodes[n.ID] = n
	}
	// Every state the family's envs made is a node of its kind.
	for _, id := range []string{env, a, b} {
		sts, err := engine.States(id)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range sts {
			if n, ok := nodes[st.ID]; !ok || n.Kind != string(st.Kind) {
				t.Errorf("state %s (env %s, %s) in the tree as %+v", st.ID, id, st.Kind, n)
			}
		}
	}
	type want1 struct {
		id, status, kind, cmd string
		branch                bool
		heads                 []string
	}
	noneID := t1.StateID + "~" + env + "~" + "2"
	for _, w := range []want1{
		{r.StateID, StatusLive, "full", "", false, nil},
		{t1.StateID, StatusLive, "fs", "echo a > /tmp/f", false, nil},
		{noneID, StatusRolledBack, "none", "cat /tmp/f; echo '<b>' >&2; false", false, nil},
		{t3.StateID, StatusRolledBack, "proc", "sleep 1000 &", false, nil},
		{t4.StateID, StatusLive, "fs", "echo b > /tmp/f", false, []string{env}},
		{ta.StateID, StatusLive, "full", "echo c > /tmp/f", true, []string{a}},
		{tb.StateID, StatusDiscarded, "fs", "echo d > /tmp/f", true, nil},
	} {
		n, ok := nodes[w.id]
		if !ok {
			t.Errorf("node %s missing from %+v", w.id, tree.Nodes)
			continue
		}
		cmd := ""
		if n.Note != nil {
			cmd = n.Note.Cmd
		}
		if n.Status != w.status || n.Kind != w.kind || cmd != w.cmd || n.Branch != w.branch || !slices.Equal(n.Heads, w.heads) {
			t.Errorf("node %s: status %s kind %s cmd %q branch %v heads %v; want %+v", w.id, n.Status, n.Kind, cmd, n.Branch, n.Heads, w)
		}
	}
	if p := nodes[noneID].Parent; p != t1.StateID {
		t.Errorf("the none turn follows %s, want its state %s", p, t1.StateID)
	}
	if p := nodes[t3.StateID].Parent; p != noneID {
		t.Errorf("the proc turn follows %s, want the none turn before it %s", p, noneID)
	}
	if p := nodes[t4.StateID].Parent; p != t1.StateID {
		t.Errorf("the turn after the rollback follows %s, want %s", p, t1.StateID)
	}
	if p := nodes[ta.StateID].Parent; p != br.State {
		t.Errorf("the child's turn follows %s, want the branch state %s", p, br.State)
	}
	if _, err := l.Tree(context.Background(), TreeScope{}); err == nil {
		t.Error("a tree with no scope")
	}
}

// TestTreeFreshTaskEnv: an env of a task that has taken no turn has made
// no state of its own (its head is the task's prepared state): its tree
// still shows that state with its head ring.
func TestTreeFreshTaskEnv(t *testing.T) {
	c, l := newLocal(t, coordinator.Options{Classify: coordinator.Full})
	r := reset(t, c, coordinator.ResetRequest{Task: countTask.Name})
	t.Cleanup(func() { c.CloseEnv(context.Background(), r.Env.ID) })
	for _, scope := range []TreeScope{{Env: r.Env.ID}, {Task: countTask.Name}} {
		tree, err := l.Tree(context.Background(), scope)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, n := range tree.Nodes {
			if n.ID == r.StateID && slices.Contains(n.Heads, r.Env.ID) && n.Status == StatusLive {
				found = true
			}
		}
		if !found {
			t.Errorf("tree of %+v: no live node %s with the env's head: %+v", scope, r.StateID, tree.Nodes)
		}
	}
}
