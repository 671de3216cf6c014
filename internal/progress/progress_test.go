package progress

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

type buf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *buf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestMeter(t *testing.T) {
	tests := []struct {
		name  string
		total int
		steps int
		err   error
		want  []string
	}{
		{name: "counted", total: 3, steps: 3, want: []string{"warm [####################] 3/3", "done"}},
		{name: "unknown total", total: 0, steps: 2, want: []string{"warm 2", "done"}},
		{name: "failure", total: 4, steps: 1, err: errors.New("boom"), want: []string{"1/4", "failed: boom"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w buf
			clock := time.Unix(0, 0)
			m := New(&w, "warm", tt.total)
			m.now = func() time.Time { clock = clock.Add(time.Second); return clock }
			for i := 0; i < tt.steps; i++ {
				m.Add(1, "x")
			}
			m.Finish(tt.err)
			m.Add(1, "after finish is ignored")
			out := w.String()
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			last := lines[len(lines)-1]
			for _, s := range tt.want {
				if !strings.Contains(last, s) {
					t.Errorf("last line %q lacks %q (all: %q)", last, s, out)
				}
			}
			if strings.Contains(out, "ignored") || strings.Contains(out, "\r") {
				t.Errorf("unexpected output %q", out)
			}
		})
	}
}

func TestNilMeterAndWriter(t *testing.T) {
	var m *Meter
	m.Add(1, "x")
	m.Finish(nil)
	New(nil, "quiet", 2).Add(1, "x") // must not panic
}

func TestConcurrentAdd(t *testing.T) {
	var w buf
	m := New(&w, "fill", 100)
	var wg sync.WaitGroup
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); m.Add(1, "") }()
	}
	wg.Wait()
	m.Finish(nil)
	if !strings.Contains(w.String(), "100/100") {
		t.Errorf("final count missing: %q", w.String())
	}
}

// TestEvent: an event is drawn at once even right after a step (which the
// rate limit holds back), and FinishNote's note ends the output.
func TestEvent(t *testing.T) {
	var b buf
	m := New(&b, "pull", 0)
	m.Step("bytes 1")
	m.Step("bytes 2") // within the rate limit: not drawn
	m.Event("layer 1/2 stored")
	m.Event("layer 2/2 stored")
	m.FinishNote("all 2 layers")
	m.Event("after the end")
	out := b.String()
	for _, want := range []string{"layer 1/2 stored\n", "layer 2/2 stored\n", "all 2 layers\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "bytes 2") || strings.Contains(out, "after the end") {
		t.Errorf("output %q: a throttled step or an event after the end was drawn", out)
	}
}
