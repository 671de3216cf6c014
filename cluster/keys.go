package cluster

import (
	"strings"
	"time"
)

// Prefix is the root of every key Arbor writes in etcd. The layout:
//
//	/arbor/v1/nodes/<node>          NodeInfo (JSON), under the node's lease
//	/arbor/v1/envs/<env>            Placement (JSON), no lease
//	/arbor/v1/states/<state>/<node> the env that made the state, under the
//	                                lease of the node holding its artifacts
//	/arbor/v1/replicas/<env>        Replica (JSON), no lease (replica.go)
//
// A node's key and its state keys vanish when its lease ends (the node
// died or left). Placements stay: an env whose node is gone is answered
// node_unavailable, not unknown_env, and a node that comes back under the
// same id with the same state directory (crash recovery) finds its envs
// where it left them; it deletes the placements of envs it no longer has
// when it registers.
const Prefix = "/arbor/v1/"

const (
	nodesPrefix  = Prefix + "nodes/"
	envsPrefix   = Prefix + "envs/"
	statesPrefix = Prefix + "states/"
)

// NodeKey is the key of a node's NodeInfo.
func NodeKey(id string) string { return nodesPrefix + id }

// EnvKey is the key of an env's Placement.
func EnvKey(id string) string { return envsPrefix + id }

// StateKey is the key saying that node holds the artifacts of state.
func StateKey(state, node string) string { return statesPrefix + state + "/" + node }

// stateNodesPrefix is the prefix of the keys naming the holders of state.
func stateNodesPrefix(state string) string { return statesPrefix + state + "/" }

// NodeInfo is what a node publishes of itself.
type NodeInfo struct {
	ID string `json:"id"`
	// Addr is host:port of the node's protocol websocket (/v1/ws).
	Addr string `json:"addr"`
	// Transfer is host:port where the node serves state transfers
	// (TransferPrefix; "": it serves none).
	Transfer string `json:"transfer,omitempty"`
	// Envs is the number of envs handed out on the node, MaxEnvs its
	// bound.
	Envs    int `json:"envs"`
	MaxEnvs int `json:"max_envs"`
	// Tasks are the tasks its reset accepts.
	Tasks []string `json:"tasks,omitempty"`
	// Draining: the node is moving its envs away (Transfer.Drain); it
	// takes no new env (resets, branch children, migrations).
	Draining bool `json:"draining,omitempty"`
	// EnvIdleTTLS is the node's idle TTL in seconds (0: never).
	EnvIdleTTLS float64   `json:"env_idle_ttl_s"`
	Version     string    `json:"version,omitempty"`
	Started     time.Time `json:"started"`
	Updated     time.Time `json:"updated"`
}

// Load is the share of the node's capacity in use (1 when it has none).
func (n NodeInfo) Load() float64 {
	if n.MaxEnvs <= 0 {
		return 1
	}
	return float64(n.Envs) / float64(n.MaxEnvs)
}

// HasTask reports whether the node offers task.
func (n NodeInfo) HasTask(task string) bool {
	for _, t := range n.Tasks {
		if t == task {
			return true
		}
	}
	return false
}

// Placement is the record of an env handed out: the node that holds it.
type Placement struct {
	Node    string    `json:"node"`
	Created time.Time `json:"created"`
}

// idOf returns the last path element of key under prefix.
func idOf(key, prefix string) string { return strings.TrimPrefix(key, prefix) }
