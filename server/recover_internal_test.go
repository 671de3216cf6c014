package server

import (
	"reflect"
	"testing"
	"time"
)

// TestLabelsRoundTrip: what the server writes on an env it hands out is
// what a restarted server reads back to adopt it.
func TestLabelsRoundTrip(t *testing.T) {
	seed := int64(7)
	tests := []struct {
		name string
		task TaskInfo
		base int
		seed *int64
	}{
		{"task", TaskInfo{Name: "hello", Image: "busybox", MaxTurns: 10, CommandTimeout: 30 * time.Second}, 3, &seed},
		{"image only", TaskInfo{Image: "busybox"}, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := labels(tt.task, tt.base, tt.seed)
			if l[labelServed] != "1" {
				t.Errorf("labels %v do not mark the env as handed out", l)
			}
			task, base := taskFromLabels(l)
			if !reflect.DeepEqual(task, tt.task) || base != tt.base {
				t.Errorf("read back %+v base %d, want %+v base %d", task, base, tt.task, tt.base)
			}
			if (tt.seed != nil) != (l[labelSeed] != "") {
				t.Errorf("seed label %q for seed %v", l[labelSeed], tt.seed)
			}
		})
	}
}
