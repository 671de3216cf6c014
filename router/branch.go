package router

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/internal/panics"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// spread places n branch children over nodes by load, one at a time on
// the node whose share of its capacity would be least after it (a tie
// goes to src, whose children need no transfer, then by id). Only src
// and nodes that serve state transfers take children, and a full node
// takes none while another has room; with no room anywhere they go to
// src, which answers too_many_envs.
//
// A draining source (not among nodes, which are Place's) ships all its
// children elsewhere when it serves transfers.
func spread(n int, nodes []cluster.NodeInfo, src cluster.NodeInfo) map[string]int {
	plan := map[string]int{}
	var cands []cluster.NodeInfo
	srcOK := src.Transfer != ""
	for _, nd := range nodes {
		if nd.ID == src.ID || (srcOK && nd.Transfer != "" && nd.MaxEnvs > 0) {
			cands = append(cands, nd)
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		if (cands[i].ID == src.ID) != (cands[j].ID == src.ID) {
			return cands[i].ID == src.ID
		}
		return cands[i].ID < cands[j].ID
	})
	for range n {
		best, bestLoad := "", 0.0
		for _, c := range cands {
			used := c.Envs + plan[c.ID]
			if c.MaxEnvs > 0 && used >= c.MaxEnvs {
				continue
			}
			load := 1.0
			if c.MaxEnvs > 0 {
				load = float64(used+1) / float64(c.MaxEnvs)
			}
			if best == "" || load < bestLoad {
				best, bestLoad = c.ID, load
			}
		}
		if best == "" {
			best = src.ID
		}
		plan[best]++
	}
	return plan
}

// branch makes a branch's children on the nodes spread picks: those of
// the source's node by the branch itself (sent at once, so that it keeps
// its place among the env's requests), the others by shipping the state
// to each other node once and branching it there by state id. A branch
// of an env none of whose children go elsewhere is forwarded as it is.
// A node whose shipment or branch fails fails its children, each on its
// own (errors[i]); when all fail, the call fails.
func (r *Router) branch(ctx context.Context, p protocol.BranchParams, params msgpack.RawMessage) answer {
	var src string
	var err error
	if p.EnvID != "" {
		src, err = r.envNode(ctx, p.EnvID)
	} else {
		src, err = r.stateNode(ctx, p.StateID)
	}
	if err != nil {
		return fail(err)
	}
	// Place counts what the router has in flight and what the nodes
	// have not published yet, as for a reset.
	srcInfo, ok := r.view.Node(src)
	if !ok {
		return fail(unavailable(src, "it is not in the cluster registry"))
	}
	plan := spread(p.N, r.place(""), srcInfo)
	k := plan[src]
	if k == p.N {
		return r.forward(ctx, src, protocol.MethodBranch, params)
	}
	var first *sent
	switch {
	case k > 0:
		q := p
		q.N = k
		first, err = r.send(ctx, src, protocol.MethodBranch, q, nil)
	case p.EnvID != "":
		// The env's current state, made a state id the other nodes can
		// be shipped.
		first, err = r.send(ctx, src, protocol.MethodCheckpoint, protocol.EnvParams{EnvID: p.EnvID}, nil)
	}
	if err != nil {
		return fail(err)
	}
	// A state shipped to other nodes must be one the client sees: with
	// the clients' own tokens (ForwardTokens) its node is asked first,
	// with the client's token, for the state's trajectory (read only);
	// another tenant's state is answered as that node answers it.
	var check *sent
	if first == nil && r.o.ForwardTokens {
		if check, err = r.send(ctx, src, protocol.MethodTrajectory, protocol.TrajectoryParams{StateID: p.StateID}, nil); err != nil {
			return fail(err)
		}
	}
	r.addPending(plan, 1)
	return func(ctx context.Context) (any, error) {
		defer r.addPending(plan, -1)
		start := time.Now()
		out := protocol.BranchResult{StateID: p.StateID}
		var errs []*protocol.Error
		if check != nil {
			if _, err := check.wait(ctx); err != nil {
				return nil, err
			}
		}
		if first != nil {
			raw, err := first.wait(ctx)
			if err != nil && p.EnvID != "" && isUnknownEnv(err) {
				// The env moved meanwhile (a drain): branch it where it
				// is now.
				if now, gerr := r.view.FreshEnvNode(ctx, p.EnvID); gerr == nil && now != "" && now != src {
					r.view.Moved(p.EnvID, now)
					return r.branch(ctx, p, params)(ctx)
				}
			}
			if err != nil {
				return nil, err
			}
			if k > 0 {
				if err := msgpack.Unmarshal(raw, &out); err != nil {
					return nil, fmt.Errorf("node %s: decode branch: %v", src, err)
				}
				errs = out.Errors
				if errs == nil {
					errs = make([]*protocol.Error, len(out.EnvIDs))
				}
				for _, id := range out.EnvIDs {
					if id != "" {
						r.view.Placed(src, id)
					}
				}
			} else {
				var cp protocol.CheckpointResult
				if err := msgpack.Unmarshal(raw, &cp); err != nil {
					return nil, fmt.Errorf("node %s: decode checkpoint: %v", src, err)
				}
				out.StateID = cp.StateID
			}
		}
		type part struct {
			node string
			n    int
			res  protocol.BranchResult
			err  error
		}
		var parts []*part
		for node, m := range plan {
			if node != src && m > 0 {
				parts = append(parts, &part{node: node, n: m})
			}
		}
		sort.Slice(parts, func(i, j int) bool { return parts[i].node < parts[j].node })
		var wg sync.WaitGroup
		for _, pt := range parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pt.err = panics.Call(r.log, func() (err error) {
					pt.res, err = r.branchOn(ctx, src, pt.node, out.StateID, pt.n)
					return err
				}, slog.String("method", protocol.MethodBranch), slog.String("node", pt.node))
			}()
		}
		wg.Wait()
		made := len(out.EnvIDs) - countErrs(errs)
		var firstErr error
		for _, pt := range parts {
			if pt.err != nil {
				r.log.Warn("branch children on another node failed", slog.String("node", pt.node), slog.String("state", out.StateID), slog.Any("err", pt.err))
				for range pt.n {
					out.EnvIDs = append(out.EnvIDs, "")
					errs = append(errs, protocol.ErrorOf(pt.err))
				}
				if firstErr == nil {
					firstErr = pt.err
				}
				continue
			}
			if k == 0 && made == 0 {
				out.Task, out.Turn = pt.res.Task, pt.res.Turn
			}
			for i, id := range pt.res.EnvIDs {
				out.EnvIDs = append(out.EnvIDs, id)
				var e *protocol.Error
				if i < len(pt.res.Errors) {
					e = pt.res.Errors[i]
				}
				errs = append(errs, e)
				if id != "" {
					made++
					r.view.Placed(pt.node, id)
				}
			}
		}
		if made == 0 {
			if firstErr == nil {
				firstErr = state.Errorf(state.ErrRestore, "branch of %s: no child was made", out.StateID)
			}
			return nil, protocol.ErrorOf(firstErr)
		}
		if countErrs(errs) > 0 {
			out.Errors = errs
		} else {
			out.Errors = nil
		}
		out.TookS = time.Since(start).Seconds()
		return out, nil
	}
}

// branchOn ships state sid from node src to node to (a no-op when to
// holds it) and branches n children of it there.
func (r *Router) branchOn(ctx context.Context, src, to, sid string, n int) (protocol.BranchResult, error) {
	var res protocol.BranchResult
	from, ok := r.view.Node(src)
	if !ok {
		return res, unavailable(src, "it left the registry")
	}
	dst, ok := r.view.Node(to)
	if !ok {
		return res, unavailable(to, "it left the registry")
	}
	st, err := r.ship.Ship(ctx, from.Transfer, dst.Transfer, sid)
	if err != nil {
		return res, state.Errorf(state.ErrRestore, "ship state %s from node %s to node %s: %v", sid, src, to, err)
	}
	if !st.Held {
		r.log.Info("shipped state", slog.String("state", sid), slog.String("from", src), slog.String("to", to),
			slog.Int64("bytes", st.Bytes), slog.Duration("took", st.Took))
	}
	s, err := r.send(ctx, to, protocol.MethodBranch, protocol.BranchParams{StateID: sid, N: n}, nil)
	if err != nil {
		return res, err
	}
	raw, err := s.wait(ctx)
	if err != nil {
		return res, err
	}
	if err := msgpack.Unmarshal(raw, &res); err != nil {
		return res, fmt.Errorf("node %s: decode branch: %w", to, err)
	}
	return res, nil
}

func countErrs(errs []*protocol.Error) int {
	n := 0
	for _, e := range errs {
		if e != nil {
			n++
		}
	}
	return n
}

// addPending counts (d = 1) or uncounts (d = -1) the children a branch
// is making on each node, as resets in flight are counted.
func (r *Router) addPending(plan map[string]int, d int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for node, m := range plan {
		if r.pending[node] += d * m; r.pending[node] <= 0 {
			delete(r.pending, node)
		}
	}
}

func isUnknownEnv(err error) bool {
	return protocol.CodeOf(err) == protocol.CodeUnknownEnv
}
