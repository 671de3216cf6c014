package benchmarks

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/state"
)

// TreeResult is one branching factor of the tree rollouts, grown the
// same way (same random picks) by branching and by replaying.
type TreeResult struct {
	Factor   int     `json:"factor"`
	Children int     `json:"children"`
	BranchS  float64 `json:"branch_s"`
	ReplayS  float64 `json:"replay_s"`
	// PrefixActions are the actions the replays re-ran to reach the
	// expanded nodes: the work branching does not redo.
	PrefixActions int    `json:"prefix_actions_not_reexecuted"`
	ChildActions  int    `json:"child_actions"`
	Errors        int    `json:"errors,omitempty"`
	Note          string `json:"note,omitempty"`
}

// treeNode is a node of a rollout tree: the actions from a fresh sandbox
// to it, where the trace continues, and (when grown by branching) its
// state id and the env holding that state alive.
type treeNode struct {
	path []Action
	next int
	sid  string
	// env holds a grown node's state (branching from it waits for its
	// checkpoint, which a bare state id would not).
	env string
}

func (n treeNode) childActions(tr Trace, steps int) []Action {
	var out []Action
	for j := 0; j < steps; j++ {
		k := n.next + j
		if k < len(tr.Turns) {
			out = append(out, tr.Turns[k])
		} else {
			out = append(out, Action{Bash: fmt.Sprintf("ls -la > /dev/null; echo step %d", k)})
		}
	}
	return out
}

// plan picks, per round, the nodes to expand; picks are drawn from the
// nodes existing at the round's start, in a fixed order, so both methods
// grow the same tree.
func treePlan(seed int64, rounds, perRound int) func(round, nodes int) []int {
	return func(round, nodes int) []int {
		rng := rand.New(rand.NewSource(seed + int64(round)*7919))
		out := make([]int, perRound)
		for i := range out {
			out[i] = rng.Intn(nodes)
		}
		return out
	}
}

// treeBench grows o.M trees per factor with branch and with replay.
func (r *rig) treeBench(ctx context.Context, h *serverHandle, tr Trace, o TreeOptions) []TreeResult {
	var out []TreeResult
	for _, b := range o.Factors {
		res := TreeResult{Factor: b}
		for m := 0; m < o.M; m++ {
			plan := treePlan(int64(1000*b+m), o.L, o.N)
			bs, pre, kids, acts, err := r.treeBranch(ctx, h, tr, o, b, plan)
			if err != nil {
				res.Errors++
				res.Note = err.Error()
			}
			rs, _, _, _, err := r.treeReplay(ctx, tr, o, b, plan)
			if err != nil {
				res.Errors++
				res.Note = err.Error()
			}
			res.BranchS += bs.Seconds()
			res.ReplayS += rs.Seconds()
			res.PrefixActions += pre
			res.Children += kids
			res.ChildActions += acts
		}
		out = append(out, res)
	}
	return out
}

func prefixNodes(tr Trace, prefix int) []treeNode {
	var nodes []treeNode
	if prefix <= 0 || prefix > len(tr.Turns) {
		prefix = len(tr.Turns)
	}
	for k := 0; k <= prefix; k++ {
		p := append(append([]Action(nil), tr.Setup...), tr.Turns[:k]...)
		nodes = append(nodes, treeNode{path: p, next: k})
	}
	return nodes
}

// treeBranch grows one tree with branch(n): the prefix is played once
// (not timed: both methods start from it), every expansion forks the
// node's state.
func (r *rig) treeBranch(ctx context.Context, h *serverHandle, tr Trace, o TreeOptions, b int,
	plan func(round, nodes int) []int) (took time.Duration, prefix, kids, acts int, err error) {
	rr, err := h.c.Reset(ctx, arbor.ResetParams{Image: tr.Image})
	if err != nil {
		return 0, 0, 0, 0, err
	}
	open := []string{rr.EnvID}
	defer func() {
		for _, id := range open {
			h.c.CloseEnv(context.Background(), id)
		}
	}()
	nodes := prefixNodes(tr, o.Prefix)
	nodes[0].sid = rr.Info.StateID
	for i, a := range nodes[len(nodes)-1].path {
		s, err := h.c.Step(ctx, rr.EnvID, toAction(a))
		if err != nil {
			return 0, 0, 0, 0, err
		}
		if k := i + 1 - len(tr.Setup); k >= 0 {
			nodes[k].sid = s.Info.StateID
		}
	}
	// The prefix's states must exist before branching from their ids.
	if env, err := h.e.Env(rr.EnvID); err == nil {
		h.e.Checkpoint(ctx, env, state.None)
	}
	start := time.Now()
	for round := 0; round < o.L; round++ {
		var mu sync.Mutex
		var wg sync.WaitGroup
		var grown []treeNode
		var firstErr error
		for _, pick := range plan(round, len(nodes)) {
			parent := nodes[pick]
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := arbor.BranchParams{StateID: parent.sid, N: b}
				if parent.env != "" {
					p = arbor.BranchParams{EnvID: parent.env, N: b}
				}
				br, err := h.c.Branch(ctx, p)
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				mu.Lock()
				open = append(open, br.EnvIDs...)
				prefix += b * len(parent.path)
				mu.Unlock()
				var cwg sync.WaitGroup
				for _, id := range br.EnvIDs {
					if id == "" {
						continue
					}
					cwg.Add(1)
					go func() {
						defer cwg.Done()
						child := treeNode{path: parent.path, next: parent.next + o.Steps, env: id}
						for _, a := range parent.childActions(tr, o.Steps) {
							s, err := h.c.Step(ctx, id, toAction(a))
							if err != nil {
								mu.Lock()
								firstErr = err
								mu.Unlock()
								return
							}
							child.path = append(child.path[:len(child.path):len(child.path)], a)
							child.sid = s.Info.StateID
						}
						mu.Lock()
						grown = append(grown, child)
						kids++
						acts += o.Steps
						mu.Unlock()
					}()
				}
				cwg.Wait()
			}()
		}
		wg.Wait()
		if firstErr != nil {
			return time.Since(start), prefix, kids, acts, firstErr
		}
		nodes = append(nodes, sortNodes(grown)...)
	}
	return time.Since(start), prefix, kids, acts, nil
}

// treeReplay grows the same tree by starting a fresh sandbox per child
// and replaying the node's actions before the child's own.
func (r *rig) treeReplay(ctx context.Context, tr Trace, o TreeOptions, b int,
	plan func(round, nodes int) []int) (took time.Duration, prefix, kids, acts int, err error) {
	nodes := prefixNodes(tr, o.Prefix)
	start := time.Now()
	for round := 0; round < o.L; round++ {
		var mu sync.Mutex
		var wg sync.WaitGroup
		var grown []treeNode
		var firstErr error
		for _, pick := range plan(round, len(nodes)) {
			parent := nodes[pick]
			for c := 0; c < b; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					child := treeNode{path: parent.path, next: parent.next + o.Steps}
					err := func() error {
						d, err := r.launchDirect(ctx, tr.Image)
						if err != nil {
							return err
						}
						defer d.close()
						for _, a := range parent.path {
							if _, err := d.exec(ctx, a); err != nil {
								return err
							}
						}
						for _, a := range parent.childActions(tr, o.Steps) {
							if _, err := d.exec(ctx, a); err != nil {
								return err
							}
							child.path = append(child.path[:len(child.path):len(child.path)], a)
						}
						return nil
					}()
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						firstErr = err
						return
					}
					grown = append(grown, child)
					prefix += len(parent.path)
					kids++
					acts += o.Steps
				}()
			}
		}
		wg.Wait()
		if firstErr != nil {
			return time.Since(start), prefix, kids, acts, firstErr
		}
		nodes = append(nodes, sortNodes(grown)...)
	}
	return time.Since(start), prefix, kids, acts, nil
}

// sortNodes orders children by their paths so that both methods number
// the grown nodes alike (goroutines finish in any order).
func sortNodes(ns []treeNode) []treeNode {
	key := func(n treeNode) string { return fmt.Sprintf("%d/%d", len(n.path), n.next) }
	for i := 1; i < len(ns); i++ {
		for j := i; j > 0 && key(ns[j]) < key(ns[j-1]); j-- {
			ns[j], ns[j-1] = ns[j-1], ns[j]
		}
	}
	return ns
}
