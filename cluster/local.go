package cluster

import "github.com/arbor-env/arbor/coordinator"

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
	for _, e := range l.co.Lost() {
		if e.ID == id {
			return true
		}
	}
	return false
}
