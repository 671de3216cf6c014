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

// treeBuild is a tree in the making: the family's envs, the states
// they made with their ancestors, and the nodes drawn from them.
type treeBuild struct {
	l       *local
	fam     map[string]*famEnv
	states  map[string]coordinator.StateRecord
	pending map[string]bool // heads whose checkpoint still runs
	live    map[string]bool // on an open env's path
	// base is subtracted from the engine's turn counts: the family's
	// largest count when its episodes began.
	base  int
	nodes map[string]*TreeNode
	// nones are the turns without a checkpoint, by state and env.
	nones map[[2]string][]*TreeNode
}

// Tree builds the lineage tree of scope from the state records (every
// state the family's envs made, and their ancestors), the open envs'
// heads and the turn log (notes.go). It takes no ticket: it reads
// records, and a head whose checkpoint still runs is shown pending.
// A tree shows only envs ctx's tenant sees; another tenant's env as
// scope is answered as an unknown one.
func (l *local) Tree(ctx context.Context, scope TreeScope) (*Tree, error) {
	ids, byID, open, err := l.members(ctx, scope)
	if err != nil {
		return nil, err
	}
	b := &treeBuild{l: l, fam: map[string]*famEnv{}, states: map[string]coordinator.StateRecord{},
		pending: map[string]bool{}, live: map[string]bool{}, nodes: map[string]*TreeNode{}, nones: map[[2]string][]*TreeNode{}}
	out := &Tree{Scope: scope, Envs: []TreeEnv{}, Nodes: []TreeNode{}}
	if out.Envs, err = b.addEnvs(ids, byID, open); err != nil {
		return nil, err
	}
	b.addHeads()
	b.addAncestors()
	b.markLive()
	byState := l.notes.of(toSet(slices.Collect(maps.Keys(b.states))))
	b.stateNodes(byState)
	b.noneNodes(byState)
	b.link()
	b.markEnds()
	out.Nodes, out.Truncated = b.sorted()
	return out, nil
}

// members are the envs of scope's tree (sorted), the records of the envs
// ctx's tenant sees, and its open envs.
func (l *local) members(ctx context.Context, scope TreeScope) ([]string, map[string]coordinator.EnvRecord, map[string]coordinator.EnvInfo, error) {
	if (scope.Env == "") == (scope.Task == "") {
		return nil, nil, nil, fmt.Errorf("%w: a tree needs exactly one of env and task", state.ErrInvalidParams)
	}
	recs, err := l.c.EnvRecords(ctx)
	if err != nil {
		return nil, nil, nil, err
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
			return nil, nil, nil, fmt.Errorf("%w: no env %q", state.ErrUnknownEnv, scope.Env)
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
	return ids, byID, open, nil
}

// addEnvs adds the family's envs, the states they made, and the base of
// their turn counts, and returns the envs as the tree lists them.
func (b *treeBuild) addEnvs(ids []string, byID map[string]coordinator.EnvRecord, open map[string]coordinator.EnvInfo) ([]TreeEnv, error) {
	envs := []TreeEnv{}
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
			if fe.End = b.l.ends.of(id); fe.End == "" {
				fe.End = coordinator.EventClose
			}
			if byID[id].Served {
				base = max(base, byID[id].Base)
			}
		}
		b.fam[id] = fe
		envs = append(envs, fe.TreeEnv)
		sts, err := b.l.c.StateRecords(id)
		if err != nil {
			return nil, err
		}
		for _, st := range sts {
			b.states[st.ID] = st
		}
	}
	b.base = max(base, 0)
	return envs, nil
}

// addHeads adds the heads the family's envs did not make (a fresh env's,
// a child's before its first turn: the branch point) with their
// ancestors, and the pending heads, which the turn log says what they
// will be.
func (b *treeBuild) addHeads() {
	for _, fe := range b.fam {
		if fe.Head == "" {
			continue
		}
		if _, ok := b.states[fe.Head]; ok {
			continue
		}
		if lin, err := b.l.c.LineageRecords(fe.Head); err == nil {
			addStates(b.states, lin)
			continue
		}
		if !fe.Open {
			continue
		}
		if n := b.l.notes.latest(fe.ID); n != nil && n.State == fe.Head {
			b.states[fe.Head] = coordinator.StateRecord{ID: n.State, Env: fe.ID, Parent: n.Parent, Turn: n.engineTurn,
				Kind: state.Kind(n.Kind), Created: n.Time}
			b.pending[fe.Head] = true
		}
	}
}

// addAncestors adds the ancestors outside the family: where it branched
// from (a task's prepared state, an env no longer listed).
func (b *treeBuild) addAncestors() {
	for _, st := range slices.Collect(maps.Values(b.states)) {
		if st.Parent == "" {
			continue
		}
		if _, ok := b.states[st.Parent]; ok {
			continue
		}
		if lin, err := b.l.c.LineageRecords(st.Parent); err == nil {
			addStates(b.states, lin)
		} // else gone (GC): st is a root here
	}
}

// markLive follows the open envs' paths: what is live.
func (b *treeBuild) markLive() {
	for _, fe := range b.fam {
		if !fe.Open {
			continue
		}
		for id := fe.Head; id != ""; {
			st, ok := b.states[id]
			if !ok {
				break
			}
			fe.path = append(fe.path, st)
			b.live[id] = true
			id = st.Parent
		}
		slices.Reverse(fe.path)
	}
}

// stateNodes makes a node of each state, with its status, reward and
// the note of the turn that made it.
func (b *treeBuild) stateNodes(byState map[string][]TurnNote) {
	for _, st := range b.states {
		n := &TreeNode{ID: st.ID, State: st.ID, Env: st.Env, Turn: st.Turn - b.base, Kind: string(st.Kind), Created: st.Created,
			Pending: b.pending[st.ID]}
		switch fe := b.fam[st.Env]; {
		case b.live[st.ID]:
			n.Status = StatusLive
		case fe != nil && fe.Open:
			n.Status = StatusRolledBack
		case fe != nil:
			n.Status = endStatus(fe.End)
		default:
			// A state outside the family (a task's prepared state's):
			// closed.
			n.Status = StatusClosed
		}
		n.Reward = b.l.c.Reward(st.ID)
		for i := range byState[st.ID] {
			if t := &byState[st.ID][i]; t.Kind != string(state.None) && t.engineTurn == st.Turn {
				n.Note = t
			}
		}
		b.nodes[n.ID] = n
	}
}

// noneNodes makes a node of each turn without a checkpoint; they are
// chained after their state per env (link).
func (b *treeBuild) noneNodes(byState map[string][]TurnNote) {
	for sid, ts := range byState {
		for i := range ts {
			t := &ts[i]
			if t.Kind != string(state.None) {
				continue
			}
			n := &TreeNode{ID: NoneNodeID(sid, t.Env, t.Turn), State: sid, Env: t.Env, Turn: t.engineTurn - b.base,
				Kind: t.Kind, Note: t, Created: t.Time, Status: noneStatus(b.fam[t.Env], sid, t.engineTurn)}
			if n.Status == StatusDiscarded {
				n.Status = StatusClosed
				if fe := b.fam[t.Env]; fe != nil {
					n.Status = endStatus(fe.End)
				}
			}
			b.nodes[n.ID] = n
			k := [2]string{sid, t.Env}
			b.nones[k] = append(b.nones[k], n)
		}
	}
}

// lastNone finds the newest turn without checkpoint env took on state
// sid before engine turn before.
func (b *treeBuild) lastNone(sid, env string, before int) *TreeNode {
	var best *TreeNode
	for _, n := range b.nones[[2]string{sid, env}] {
		if n.Turn+b.base < before && (best == nil || n.Turn > best.Turn) {
			best = n
		}
	}
	return best
}

// link sets each node's parent (the last turn without checkpoint before
// it on its parent state, else that state) and the open envs' heads: the
// newest live node of each on its head state.
func (b *treeBuild) link() {
	for _, n := range b.nodes {
		var p *TreeNode
		if n.Kind == string(state.None) {
			if p = b.lastNone(n.State, n.Env, n.Turn+b.base); p == nil {
				p = b.nodes[n.State]
			}
		} else if parent := b.states[n.State].Parent; parent != "" {
			if p = b.lastNone(parent, n.Env, n.Turn+b.base); p == nil {
				p = b.nodes[parent]
			}
		}
		if p != nil {
			n.Parent, n.Branch = p.ID, p.Env != n.Env
		}
	}
	for _, fe := range b.fam {
		if !fe.Open {
			continue
		}
		h := b.nodes[fe.Head]
		if h == nil {
			continue
		}
		if n := b.lastNone(fe.Head, fe.ID, fe.engineTurn+1); n != nil && n.Status == StatusLive {
			h = n
		}
		h.Heads = append(h.Heads, fe.ID)
	}
}

// markEnds marks the leaves: the newest node of each env that ended,
// unless an open env's path goes through it (a child closed before its
// first turn left the branch state). A leaf after turns without
// checkpoint shows its state's reward.
func (b *treeBuild) markEnds() {
	last := map[string]*TreeNode{}
	for _, n := range b.nodes {
		if fe := b.fam[n.Env]; fe != nil && !fe.Open {
			if l := last[n.Env]; l == nil || n.Turn > l.Turn || n.Turn == l.Turn && kindOrder(n.Kind) > kindOrder(l.Kind) {
				last[n.Env] = n
			}
		}
	}
	for env, n := range last {
		if n.Status != StatusLive {
			n.End = b.fam[env].End
			if n.Reward == nil {
				n.Reward = b.l.c.Reward(n.State)
			}
		}
	}
}

// sorted is the nodes oldest first by turn (a parent's engine turn is
// below its child's, a state's below the turns without checkpoint that
// follow it), at most maxTreeNodes of them (truncated: more).
func (b *treeBuild) sorted() (nodes []TreeNode, truncated bool) {
	nodes = make([]TreeNode, 0, len(b.nodes))
	for _, n := range b.nodes {
		nodes = append(nodes, *n)
	}
	slices.SortFunc(nodes, func(x, y TreeNode) int {
		return cmp.Or(cmp.Compare(x.Turn, y.Turn), cmp.Compare(kindOrder(x.Kind), kindOrder(y.Kind)),
			x.Created.Compare(y.Created), cmp.Compare(x.ID, y.ID))
	})
	if len(nodes) > maxTreeNodes {
		return nodes[:maxTreeNodes], true
	}
	return nodes, false
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
