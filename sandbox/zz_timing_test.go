package sandbox_test

import (
	"sort"
	"testing"
	"time"

	"github.com/arbor-env/arbor/sandbox"
)

func TestZZTiming(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	var d []time.Duration
	for i := 0; i < 400; i++ {
		t0 := time.Now()
		run(t, sb, "echo hi", 10*time.Second)
		d = append(d, time.Since(t0))
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	t.Logf("step round trip: p50 %v p90 %v", d[len(d)/2], d[len(d)*9/10])
}
