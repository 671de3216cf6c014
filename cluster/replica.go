package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/arbor-env/arbor/internal/tenant"
)

// Replica is the record of where an env's last committed state has a
// copy: a node other than the env's, and the state (key ReplicaKey, no
// lease: it outlives the env's node, which is what it is for). Image and
// Labels are the env's, which the replica's node needs to open it as an
// episode of its task: the state may have been made by another env (a
// task pool's, whose post-setup state is a fresh env's head until its
// first turn), whose record carries that env's labels, not these.
type Replica struct {
	Node   string            `json:"node"`
	State  string            `json:"state"`
	At     time.Time         `json:"at"`
	Image  string            `json:"image,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// ReplicaKey is the key of an env's Replica.
func ReplicaKey(env string) string { return replicasPrefix + env }

const replicasPrefix = Prefix + "replicas/"

// Replicate ships the last committed state of every env of this node to
// a second node, chosen once per env (the least loaded other live node
// that serves transfers), every interval while ctx lasts, and records it
// in etcd (Replica): with --replicas 2 an env whose node dies is
// restored there by a router at that state (docs/cluster.md,
// "Replicas"). Shipping is incremental, so an env that did one turn costs
// its new image and the difference of its files.
func (t *Transfer) Replicate(ctx context.Context, interval time.Duration) {
	co, n := t.o.Coordinator, t.o.Node
	if co == nil || n == nil {
		return
	}
	type rep struct{ node, addr, state string }
	reps := map[string]*rep{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// A replica whose node left the registry (died, or stopped) is
		// no replica: the env is shipped to another node at once, not at
		// its next turn, which may be long in coming (an agent thinking).
		live := map[string]bool{}
		peers, perr := n.Peers(ctx)
		for _, p := range peers {
			live[p.ID] = true
		}
		open := map[string]bool{}
		for _, e := range co.Envs(tenant.Admin(ctx)) {
			id := e.Env.ID
			open[id] = true
			head, err := t.o.Engine.CommittedHead(id)
			if err != nil {
				continue
			}
			r := reps[id]
			if r != nil && perr == nil && !live[r.node] {
				t.log.Warn("replica node gone; replicating elsewhere", slog.String("env", id), slog.String("node", r.node))
				delete(reps, id)
				r = nil
			}
			if r != nil && r.state == head {
				continue
			}
			if r == nil {
				to, ok := t.replicaNode(ctx, n)
				if !ok {
					continue
				}
				r = &rep{node: to.ID, addr: to.Transfer}
				reps[id] = r
			}
			var st MigrateStats
			err = t.shipLineage(ctx, head, r.addr, &st)
			if err == nil {
				// Kept there while it is the replica (imported states
				// have only a retention); the one it replaces is let go.
				err = t.keep(ctx, r.addr, head, true)
			}
			if err != nil {
				t.log.Warn("replicate state", slog.String("env", id), slog.String("to", r.node), slog.Any("err", err))
				delete(reps, id) // another node next time
				continue
			}
			if r.state != "" {
				t.keep(ctx, r.addr, r.state, false)
			}
			b, _ := json.Marshal(Replica{Node: r.node, State: head, At: time.Now(), Image: e.Env.Image, Labels: e.Env.Labels()})
			if err := n.put(ReplicaKey(id), string(b)); err != nil {
				t.log.Warn("record replica", slog.String("env", id), slog.Any("err", err))
				continue
			}
			r.state = head
		}
		for id := range reps {
			if r := reps[id]; !open[id] {
				// Closed, or migrated away: its replica goes.
				delete(reps, id)
				if r.state != "" {
					t.keep(ctx, r.addr, r.state, false)
				}
				if err := n.del(ReplicaKey(id)); err != nil {
					t.log.Warn("delete replica record", slog.String("env", id), slog.Any("err", err))
				}
			}
		}
	}
}

// replicaNode is the least loaded other live node that takes envs.
func (t *Transfer) replicaNode(ctx context.Context, n *Node) (NodeInfo, bool) {
	peers, err := n.Peers(ctx)
	if err != nil {
		return NodeInfo{}, false
	}
	var best NodeInfo
	bl := 2.0
	for _, p := range peers {
		if p.ID == n.ID() || p.Draining || p.Transfer == "" || p.MaxEnvs <= 0 {
			continue
		}
		if l := p.Load(); l < bl {
			best, bl = p, l
		}
	}
	return best, best.ID != ""
}

// Replica reads env's replica record ("" node: none).
func (v *View) Replica(ctx context.Context, env string) (Replica, error) {
	return readJSON[Replica](ctx, v, ReplicaKey(env), "replica of "+env)
}

// Adopt asks the node whose transfer endpoint is at addr to open env at
// its replica's state, which it holds, with the image and labels the
// replica records (a replica's restore): the env's first operation there
// reports that state as recovered.
func (c *ShipClient) Adopt(ctx context.Context, addr, env string, rp Replica) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	t := &Transfer{o: TransferOptions{Token: c.Token}, cli: c.cli}
	var ok struct{}
	req := AdoptRequest{Env: env, State: rp.State, Image: rp.Image, Labels: rp.Labels, Recovered: true}
	if err := t.post(ctx, addr, "adopt", "application/json", jsonBody(req), &ok); err != nil {
		return fmt.Errorf("adopt %s at %s on %s: %w", env, rp.State, addr, err)
	}
	return nil
}

// KeepRequest pins (Keep) or unpins a state on a node: a replica's.
type KeepRequest struct {
	State string `json:"state"`
	Keep  bool   `json:"keep"`
}

func (t *Transfer) keep(ctx context.Context, addr, state string, on bool) error {
	var ok struct{}
	err := t.post(ctx, addr, "keep", "application/json", jsonBody(KeepRequest{State: state, Keep: on}), &ok)
	if err != nil && !on {
		t.log.Warn("let a replica go", slog.String("state", state), slog.Any("err", err))
	}
	return err
}

func (t *Transfer) serveKeep(w http.ResponseWriter, r *http.Request) {
	var req KeepRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.State == "" {
		writeJSON(w, http.StatusBadRequest, transferError{fmt.Sprintf("bad keep request: %v", err)})
		return
	}
	f := t.o.Engine.Unpin
	if req.Keep {
		f = t.o.Engine.Pin
	}
	if err := f(req.State); err != nil {
		writeJSON(w, errCode(err), transferError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// Keep pins (on) or unpins a state on the node whose transfer endpoint
// is at addr.
func (c *ShipClient) Keep(ctx context.Context, addr, state string, on bool) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	t := &Transfer{o: TransferOptions{Token: c.Token}, cli: c.cli, log: slog.New(slog.DiscardHandler)}
	return t.keep(ctx, addr, state, on)
}
