package ui

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/state"
)

// maxTreeNodes bounds one tree (Tree.Truncated says when it cut).
const maxTreeNodes = 5000

// Node statuses of a tree.
const (
	// StatusLive: on the current path of an open env (an ancestor of its
	// head, or the head).
	StatusLive = "live"
	// StatusRolledBack: made by an env that is still open, which has
	// since been rolled back to an earlier state.
	StatusRolledBack = "rolled_back"
	// StatusDiscarded, StatusFinished, StatusClosed: made by an env that
	// has ended since and on no open env's path; it was discarded, it
	// finished (evaluate with fork false), or it was closed (also:
	// promoted away, or ended when the coordinator does not remember how:
	// ends.go).
	StatusDiscarded = "discarded"
	StatusFinished  = "finished"
	StatusClosed    = "closed"
)

// endStatus is the status of the states of an env that ended by event
// end (ends.go).
func endStatus(end string) string {
	switch end {
	case coordinator.EventDiscard:
		return StatusDiscarded
	case coordinator.EventFinish:
		return StatusFinished
	}
	return StatusClosed
}

// TreeScope picks a tree: the family of one env (every env branched from
// the top served env above it, recursively) or every env of a task.
type TreeScope struct {
	Env  string `json:"env,omitempty"`
	Task string `json:"task,omitempty"`
}

// TreeNode is one node of a lineage tree: a state (Kind fs, proc or
// full), or a turn that took no checkpoint (Kind none), which shares the
// state it left unchanged and is drawn after it.
type TreeNode struct {
	// ID is the state id, or NoneNodeID for a turn without a checkpoint.
	ID    string `json:"id"`
	State string `json:"state"`
	// Parent is the node this one follows: the parent state, or the
	// last turn without checkpoint the same env took on it before.
	Parent string `json:"parent,omitempty"`
	Env    string `json:"env"`
	Turn   int    `json:"turn"`
	Kind   string `json:"kind"`
	Status string `json:"status"`
	// Branch: Parent is another env's (the edge is a branch).
	Branch bool `json:"branch,omitempty"`
	// Heads are the open envs whose current state this node is.
	Heads []string `json:"heads,omitempty"`
	// Pending: the state's checkpoint still runs (not committed yet).
	Pending bool `json:"pending,omitempty"`
	// Note is the turn that made the node, when the log still has it.
	Note    *TurnNote `json:"note,omitempty"`
	Created time.Time `json:"created"`
	// Reward is the newest verdict of the task's verifier on the node's
	// state (evaluate, finish), from the trajectory records.
	Reward *float64 `json:"reward,omitempty"`
	// End marks the leaf of an env that ended (its newest node, when on
	// no open env's path): how it ended, "finish", "discard", "close"
	// or "promote" ("close" when not remembered).
	End string `json:"end,omitempty"`
}

// TreeEnv is an env of a tree's family.
type TreeEnv struct {
	ID     string `json:"id"`
	Task   string `json:"task,omitempty"`
	Origin string `json:"origin,omitempty"`
	Head   string `json:"head,omitempty"`
	Open   bool   `json:"open"`
	Turn   int    `json:"turn"`
	// End is how a closed env ended (TreeNode.End).
	End string `json:"end,omitempty"`
}

// Tree is the lineage tree of a scope: its envs and its nodes, oldest
// first (a node's parent, when in the tree, comes before it).
type Tree struct {
	Scope     TreeScope  `json:"scope"`
	Envs      []TreeEnv  `json:"envs"`
	Nodes     []TreeNode `json:"nodes"`
	Truncated bool       `json:"truncated,omitempty"`
}

// famEnv is what Tree knows of one env of the family.
type famEnv struct {
	TreeEnv
	engineTurn int                       // the engine's count, for an open env
	path       []coordinator.StateRecord // root first, to its head, for an open env
}

// Tree builds the lineage tree of scope from the state records (every
// state the family's envs made, and their ancestors), the open envs'
// heads and the turn log (notes.go). It takes no ticket: it reads
// records, and a head whose checkpoint still runs is shown pending.
// A tree shows only envs ctx's tenant sees; another tenant's env as
// scope is answered as an unknown one.
func (l *local) Tree(ctx context.Context, scope TreeScope) (*Tree, error) {
	if (scope.Env == "") == (scope.Task == "") {
		return nil, fmt.Errorf("%w: a tree needs exactly one of env and task", coordinator.ErrInvalidParams)
	}
	recs, err := l.c.EnvRecords(ctx)
	if err != nil {
		return nil, err
	}
	byID := map[string]coordinator.EnvRecord{}
	for _, r := range recs {
		byID[r.ID] = r
	}
	open := map[string]coordinator.EnvInfo{}
	for _, e := range l.c.Envs(ctx) {
		open[e.Env.ID] = e
	}
	served := func(id string) bool {
		_, ok := open[id]
		return ok || byID[id].Served
	}
	var ids []string
	if scope.Env != "" {
		if _, ok := byID[scope.Env]; !ok && open[scope.Env].Env == nil {
			return nil, fmt.Errorf("%w: no env %q", coordinator.ErrUnknownEnv, scope.Env)
		}
		ids = family(scope.Env, byID, served)
	} else {
		for id, r := range byID {
			if r.Served && r.Task == scope.Task {
				ids = append(ids, id)
			}
		}
		for id, e := range open {
			if e.Task.Name == scope.Task && !byID[id].Served {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)

	out := &Tree{Scope: scope, Envs: []TreeEnv{}, Nodes: []TreeNode{}}
	states := map[string]coordinator.StateRecord{}
	fam := map[string]*famEnv{}
	base := -1
	for _, id := range ids {
		fe := &famEnv{TreeEnv: TreeEnv{ID: id, Origin: byID[id].Origin, Head: byID[id].Head}}
		if e, ok := open[id]; ok {
			fe.Open, fe.Task, fe.Head, fe.Turn = true, e.Task.Name, e.Env.Head(), e.Turn
			fe.engineTurn = e.Env.Turn()
			fe.Origin = e.Env.Origin
			base = max(base, fe.engineTurn-fe.Turn)
		} else {
			fe.Task = byID[id].Task
			if fe.End = l.ends.of(id); fe.End == "" {
				fe.End = coordinator.EventClose
			}
			if byID[id].Served {
				base = max(base, byID[id].Base)
			}
		}
		fam[id] = fe
		out.Envs = append(out.Envs, fe.TreeEnv)
		sts, err := l.c.StateRecords(id)
		if err != nil {
			return nil, err
		}
		for _, st := range sts {
			states[st.ID] = st
		}
	}
	base = max(base, 0)
	// Heads the family's envs did not make (a fresh env's, a child's
	// before its first turn: the branch point), and pending heads, which
	// the turn log says what they will be.
	pending := map[string]bool{}
	for _, fe := range fam {
		if fe.Head == "" {
			continue
		}
		if _, ok := states[fe.Head]; ok {
			continue
		}
		if lin, err := l.c.LineageRecords(fe.Head); err == nil {
			addStates(states, lin)
			continue
		}
		if !fe.Open {
			continue
		}
		if n := l.notes.latest(fe.ID); n != nil && n.State == fe.Head {
			states[fe.Head] = coordinator.StateRecord{ID: n.State, Env: fe.ID, Parent: n.Parent, Turn: n.engineTurn,
				Kind: state.Kind(n.Kind), Created: n.Time}
			pending[fe.Head] = true
		}
	}
	// Ancestors outside the family: where it branched from (a task's
	// prepared state, an env no longer listed).
	for _, st := range slices.Collect(maps.Values(states)) {
		if st.Parent == "" {
			continue
		}
		if _, ok := states[st.Parent]; ok {
			continue
		}
		if lin, err := l.c.LineageRecords(st.Parent); err == nil {
			addStates(states, lin)
		} // else gone (GC): st is a root here
	}
	// The open envs' paths: what is live.
	live := map[string]bool{}
	for _, fe := range fam {
		if !fe.Open {
			continue
		}
		for id := fe.Head; id != ""; {
			st, ok := states[id]
			if !ok {
				break
			}
			fe.path = append(fe.path, st)
			live[id] = true
			id = st.Parent
		}
		slices.Reverse(fe.path)
	}
	ids = ids[:0]
	for id := range states {
		ids = append(ids, id)
	}
	byState := l.notes.of(toSet(ids))

	nodes := map[string]*TreeNode{}
	for _, st := range states {
		n := &TreeNode{ID: st.ID, State: st.ID, Env: st.Env, Turn: st.Turn - base, Kind: string(st.Kind), Created: st.Created,
			Pending: pending[st.ID]}
		switch {
		case live[st.ID]:
			n.Status = StatusLive
		case fam[st.Env] != nil && fam[st.Env].Open:
			n.Status = StatusRolledBack
		default:
			// An env of the family that ended, or one outside it (a
			// task's prepared state's): closed.
			n.Status = StatusClosed
			if fe := fam[st.Env]; fe != nil {
				n.Status = endStatus(fe.End)
			}
		}
		n.Reward = l.c.Reward(st.ID)
		for i := range byState[st.ID] {
			if t := &byState[st.ID][i]; t.Kind != string(state.None) && t.engineTurn == st.Turn {
				n.Note = t
			}
		}
		nodes[n.ID] = n
	}
	// Turns without a checkpoint, chained after their state per env.
	nones := map[[2]string][]*TreeNode{} // by state and env
	for sid, ts := range byState {
		for i := range ts {
			t := &ts[i]
			if t.Kind != string(state.None) {
				continue
			}
			n := &TreeNode{ID: NoneNodeID(sid, t.Env, t.Turn), State: sid, Env: t.Env, Turn: t.engineTurn - base,
				Kind: t.Kind, Note: t, Created: t.Time, Status: noneStatus(fam[t.Env], sid, t.engineTurn)}
			if n.Status == StatusDiscarded {
				n.Status = StatusClosed
				if fe := fam[t.Env]; fe != nil {
					n.Status = endStatus(fe.End)
				}
			}
			nodes[n.ID] = n
			k := [2]string{sid, t.Env}
			nones[k] = append(nones[k], n)
		}
	}
	// lastNone finds the newest turn without checkpoint env took on
	// state sid before engine turn before.
	lastNone := func(sid, env string, before int) *TreeNode {
		var best *TreeNode
		for _, n := range nones[[2]string{sid, env}] {
			if n.Turn+base < before && (best == nil || n.Turn > best.Turn) {
				best = n
			}
		}
		return best
	}
	for _, n := range nodes {
		var p *TreeNode
		if n.Kind == string(state.None) {
			if p = lastNone(n.State, n.Env, n.Turn+base); p == nil {
				p = nodes[n.State]
			}
		} else if parent := states[n.State].Parent; parent != "" {
			if p = lastNone(parent, n.Env, n.Turn+base); p == nil {
				p = nodes[parent]
			}
		}
		if p != nil {
			n.Parent, n.Branch = p.ID, p.Env != n.Env
		}
	}
	// Heads: the newest live node of each open env on its head state.
	for _, fe := range fam {
		if !fe.Open {
			continue
		}
		h := nodes[fe.Head]
		if h == nil {
			continue
		}
		if n := lastNone(fe.Head, fe.ID, fe.engineTurn+1); n != nil && n.Status == StatusLive {
			h = n
		}
		h.Heads = append(h.Heads, fe.ID)
	}
	// Leaves: the newest node of each env that ended, unless an open
	// env's path goes through it (a child closed before its first turn
	// left the branch state). A leaf after turns without checkpoint
	// shows its state's reward.
	last := map[string]*TreeNode{}
	for _, n := range nodes {
		if fe := fam[n.Env]; fe != nil && !fe.Open {
			if l := last[n.Env]; l == nil || n.Turn > l.Turn || n.Turn == l.Turn && kindOrder(n.Kind) > kindOrder(l.Kind) {
				last[n.Env] = n
			}
		}
	}
	for env, n := range last {
		if n.Status != StatusLive {
			n.End = fam[env].End
			if n.Reward == nil {
				n.Reward = l.c.Reward(n.State)
			}
		}
	}
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, *n)
	}
	// Oldest first by turn: a parent's engine turn is below its child's,
	// a state's below the turns without checkpoint that follow it.
	slices.SortFunc(out.Nodes, func(a, b TreeNode) int {
		return cmp.Or(cmp.Compare(a.Turn, b.Turn), cmp.Compare(kindOrder(a.Kind), kindOrder(b.Kind)),
			a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	if len(out.Nodes) > maxTreeNodes {
		out.Nodes, out.Truncated = out.Nodes[:maxTreeNodes], true
	}
	return out, nil
}

// NoneNodeID is the tree node id of env's turn turn (counted since its
// episode began) that took no checkpoint and left state sid: STATE~ENV~TURN.
func NoneNodeID(sid, env string, turn int) string {
	return sid + "~" + env + "~" + strconv.Itoa(turn)
}

// kindOrder puts a state before the turns without checkpoint of the same
// turn number (none of a child after its branch state).
func kindOrder(k string) int {
	if k == string(state.None) {
		return 1
	}
	return 0
}

// noneStatus is the status of a turn without checkpoint env took at
// engine turn turn on state sid: live while env is open and the turn is
// on its current history (sid on its path, and the next state on it came
// after the turn, or sid is its head and the env has not been rolled
// back before the turn).
func noneStatus(fe *famEnv, sid string, turn int) string {
	if fe == nil || !fe.Open {
		return StatusDiscarded
	}
	for i, st := range fe.path {
		if st.ID != sid {
			continue
		}
		if i+1 < len(fe.path) && fe.path[i+1].Turn > turn || i+1 == len(fe.path) && turn <= fe.engineTurn {
			return StatusLive
		}
	}
	return StatusRolledBack
}

// family is the envs of env's tree: up through Origin to the top served
// env, then every env whose Origin chain reaches it.
func family(env string, recs map[string]coordinator.EnvRecord, served func(string) bool) []string {
	top := env
	for seen := map[string]bool{top: true}; ; {
		o := recs[top].Origin
		if o == "" || seen[o] || !served(o) {
			break
		}
		seen[o], top = true, o
	}
	in := map[string]bool{top: true}
	var reaches func(id string, depth int) bool
	reaches = func(id string, depth int) bool {
		if v, ok := in[id]; ok {
			return v
		}
		o := recs[id].Origin
		v := o != "" && depth < len(recs) && reaches(o, depth+1)
		in[id] = v
		return v
	}
	out := []string{top}
	for id := range recs {
		if id != top && served(id) && reaches(id, 0) {
			out = append(out, id)
		}
	}
	if !slices.Contains(out, env) {
		out = append(out, env) // open, not recorded yet
	}
	return out
}

// addStates adds to states those of sts it lacks.
func addStates(states map[string]coordinator.StateRecord, sts []coordinator.StateRecord) {
	for _, st := range sts {
		if _, ok := states[st.ID]; !ok {
			states[st.ID] = st
		}
	}
}

func toSet(ids []string) map[string]bool {
	s := make(map[string]bool, len(ids))
	for _, id := range ids {
		s[id] = true
	}
	return s
}
