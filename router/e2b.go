package router

import (
	"context"

	"github.com/arbor-env/arbor/internal/tenant"
)

// The router's side of the E2B API (e2b.Placer, docs/e2b.md): a
// sandbox's requests go whole to the node holding its env, as an OpenEnv
// connection's do.

// nodeToken is the token the router presents to a node for ctx's
// request: the client's own when it forwards tokens, else its own.
func (r *Router) nodeToken(ctx context.Context) string {
	if r.o.ForwardTokens {
		return tenant.Token(ctx)
	}
	return r.o.NodeToken
}

// E2BEnvNode is the node holding env id.
func (r *Router) E2BEnvNode(ctx context.Context, id string) (addr, token string, err error) {
	node, err := r.envNode(ctx, id)
	if err != nil {
		return "", "", err
	}
	info, ok := r.view.Node(node)
	if !ok {
		return "", "", unavailable(node, "it is not in the cluster registry (its lease ended: the node died or left)")
	}
	return info.Addr, r.nodeToken(ctx), nil
}

// E2BStateNode is a live node holding state sid.
func (r *Router) E2BStateNode(ctx context.Context, sid string) (addr, token string, err error) {
	node, err := r.stateNode(ctx, sid)
	if err != nil {
		return "", "", err
	}
	info, ok := r.view.Node(node)
	if !ok {
		return "", "", unavailable(node, "it is not in the cluster registry")
	}
	return info.Addr, r.nodeToken(ctx), nil
}

// E2BPlace is the least loaded live node offering task ("": any), counted
// as pending there until done.
func (r *Router) E2BPlace(ctx context.Context, task string) (addr, token string, done func(), ok bool) {
	cands := r.place(task)
	if len(cands) == 0 {
		return "", "", nil, false
	}
	id := cands[0].ID
	r.mu.Lock()
	r.pending[id]++
	r.mu.Unlock()
	done = func() {
		r.mu.Lock()
		if r.pending[id]--; r.pending[id] <= 0 {
			delete(r.pending, id)
		}
		r.mu.Unlock()
	}
	return cands[0].Addr, r.nodeToken(ctx), done, true
}

// E2BNodes are every live node.
func (r *Router) E2BNodes(ctx context.Context) (addrs, tokens []string) {
	for _, n := range r.view.Nodes() {
		addrs = append(addrs, n.Addr)
		tokens = append(tokens, r.nodeToken(ctx))
	}
	return addrs, tokens
}
