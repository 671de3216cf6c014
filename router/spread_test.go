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
		name     string
		n        int
		nodes    []cluster.NodeInfo
		want     map[string]int
		draining bool
	}{
		{"even", 4, []cluster.NodeInfo{nd("a", 1, 8, true), nd("b", 0, 8, true)}, map[string]int{"a": 2, "b": 2}, false},
		{"tie to the source", 1, []cluster.NodeInfo{nd("a", 0, 8, true), nd("b", 0, 8, true)}, map[string]int{"a": 1}, false},
		{"least loaded first", 3, []cluster.NodeInfo{nd("a", 6, 8, true), nd("b", 0, 8, true), nd("c", 1, 8, true)}, map[string]int{"b": 2, "c": 1}, false},
		{"by share of capacity", 3, []cluster.NodeInfo{nd("a", 2, 4, true), nd("b", 2, 16, true)}, map[string]int{"b": 3}, false},
		{"full nodes take none", 3, []cluster.NodeInfo{nd("a", 1, 8, true), nd("b", 8, 8, true)}, map[string]int{"a": 3}, false},
		{"no room: the source answers", 2, []cluster.NodeInfo{nd("a", 8, 8, true), nd("b", 8, 8, true)}, map[string]int{"a": 2}, false},
		{"no transfers on the source", 4, []cluster.NodeInfo{nd("a", 4, 8, false), nd("b", 0, 8, true)}, map[string]int{"a": 4}, false},
		{"no transfers on the other", 4, []cluster.NodeInfo{nd("a", 4, 8, true), nd("b", 0, 8, false)}, map[string]int{"a": 4}, false},
		{"a draining source keeps only what no other node has room for", 3, []cluster.NodeInfo{nd("a", 1, 8, true), nd("b", 6, 8, true)}, map[string]int{"b": 2, "a": 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var src cluster.NodeInfo
			for _, n := range tt.nodes {
				if n.ID == "a" {
					src = n
				}
			}
			if tt.draining {
				// Place leaves a draining node out.
				src.Draining = true
				tt.nodes = tt.nodes[1:]
			}
			if got := spread(tt.n, tt.nodes, src); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("spread: %v, want %v", got, tt.want)
			}
		})
	}
}
