package cluster

import (
	"context"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/tenant"
)

// CoordinatorLocal is the Local of a node serving with co: its capacity
// and tasks, and the states its engine still holds.
func CoordinatorLocal(co *coordinator.Coordinator) Local { return coLocal{co} }

type coLocal struct{ co *coordinator.Coordinator }

func (l coLocal) Capacity() NodeInfo {
	return NodeInfo{MaxEnvs: l.co.MaxEnvs(), Tasks: l.co.TaskNames(), EnvIdleTTLS: l.co.IdleTTL().Seconds()}
}

func (l coLocal) HasState(id string) bool {
	_, err := l.co.Engine().State(id)
	return err == nil
}

func (l coLocal) HasEnv(id string) bool {
	if l.co.Has(id) {
		return true
	}
	for _, e := range l.co.Lost(tenant.Admin(context.Background())) {
		if e.ID == id {
			return true
		}
	}
	return false
}

// CloseEnv closes env under its ticket: the operations queued before
// finish first.
func (l coLocal) CloseEnv(ctx context.Context, id string) error {
	wait, release := l.co.Ticket(id)
	wait()
	defer release()
	return l.co.CloseEnv(ctx, id)
}
