package router

import (
	"reflect"
	"testing"

	"github.com/arbor-env/arbor/cluster"
)

func TestSpread(t *testing.T) {
	nd := func(id string, envs, max int, transfer bool) cluster.NodeInfo {
		n := cluster.NodeInfo{ID: id, Envs: envs, MaxEnvs: max}
		if transfer {
			n.Transfer = id + ":1"
		}
		return n
	}
	tests := []struct {
		name  string
		n     int
		nodes []cluster.NodeInfo
		want  map[string]int
	}{
		{"even", 4, []cluster.NodeInfo{nd("a", 1, 8, true), nd("b", 0, 8, true)}, map[string]int{"a": 2, "b": 2}},
		{"tie to the source", 1, []cluster.NodeInfo{nd("a", 0, 8, true), nd("b", 0, 8, true)}, map[string]int{"a": 1}},
		{"least loaded first", 3, []cluster.NodeInfo{nd("a", 6, 8, true), nd("b", 0, 8, true), nd("c", 1, 8, true)}, map[string]int{"b": 2, "c": 1}},
		{"by share of capacity", 3, []cluster.NodeInfo{nd("a", 2, 4, true), nd("b", 2, 16, true)}, map[string]int{"b": 3}},
		{"full nodes take none", 3, []cluster.NodeInfo{nd("a", 1, 8, true), nd("b", 8, 8, true)}, map[string]int{"a": 3}},
		{"no room: the source answers", 2, []cluster.NodeInfo{nd("a", 8, 8, true), nd("b", 8, 8, true)}, map[string]int{"a": 2}},
		{"no transfers on the source", 4, []cluster.NodeInfo{nd("a", 4, 8, false), nd("b", 0, 8, true)}, map[string]int{"a": 4}},
		{"no transfers on the other", 4, []cluster.NodeInfo{nd("a", 4, 8, true), nd("b", 0, 8, false)}, map[string]int{"a": 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := spread(tt.n, tt.nodes, "a"); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("spread: %v, want %v", got, tt.want)
			}
		})
	}
}
