package image

import (
	"fmt"
	"io"
	"log/slog"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/arbor-env/arbor/internal/progress"
)

// pullProgress reports a pull or an import: layers done, bytes, rate, on
// the progress meter the rest of Arbor uses (internal/progress: one line
// redrawn on a terminal, lines elsewhere) and, per layer, in the log.
type pullProgress struct {
	m   *progress.Meter
	log *slog.Logger

	mu     sync.Mutex
	sizes  []int64 // per layer, as shipped (0: unknown)
	got    []int64
	done   []bool
	total  int64
	moved  int64 // bytes read, retries included
	layers int
}

// newProgress reports to w (nil: only to the log).
func newProgress(w io.Writer, log *slog.Logger, what string) *pullProgress {
	return &pullProgress{m: progress.New(w, what, 0), log: log}
}

func (p *pullProgress) begin(n int, ls []v1.Layer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.layers = n
	p.sizes, p.got, p.done = make([]int64, n), make([]int64, n), make([]bool, n)
	for i, l := range ls {
		if sz, err := l.Size(); err == nil {
			p.sizes[i] = sz
			p.total += sz
		}
	}
}

// skip marks layer i as already stored.
func (p *pullProgress) skip(i int, size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done[i], p.got[i] = true, size
	p.event(fmt.Sprintf("layer %d/%d already stored", i+1, p.layers))
}

// add counts n bytes read of layer i.
func (p *pullProgress) add(i int, n int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got[i] += n
	p.moved += n
	p.m.Step(p.state(""))
}

// unpacked marks layer i as stored.
func (p *pullProgress) unpacked(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done[i] = true
	p.event(fmt.Sprintf("layer %d/%d unpacked", i+1, p.layers))
}

// retry forgets what layer i had read: it starts again.
func (p *pullProgress) retry(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got[i] = 0
	p.event(fmt.Sprintf("layer %d/%d failed, trying again", i+1, p.layers))
}

func (p *pullProgress) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.done {
		p.done[i] = true
	}
	p.m.FinishNote(p.state("done"))
	p.logState("done")
}

// event draws the state with note at once and logs it. The caller holds
// p.mu.
func (p *pullProgress) event(note string) {
	p.m.Event(p.state(note))
	p.logState(note)
}

// state words layers done, bytes and rate, then note. The caller holds
// p.mu.
func (p *pullProgress) state(note string) string {
	done, got := p.counts()
	s := fmt.Sprintf("layers %d/%d, %.1f", done, p.layers, float64(got)/1e6)
	if p.total > 0 {
		s += fmt.Sprintf("/%.1f", float64(p.total)/1e6)
	}
	s += fmt.Sprintf(" MB, %.1f MB/s", p.rate())
	if note != "" {
		s += ", " + note
	}
	return s
}

// counts are the layers done and the bytes read of them. The caller
// holds p.mu.
func (p *pullProgress) counts() (done int, got int64) {
	for i := range p.got {
		got += p.got[i]
		if p.done[i] {
			done++
		}
	}
	return done, got
}

// rate is MB/s read so far. The caller holds p.mu.
func (p *pullProgress) rate() float64 {
	return float64(p.moved) / max(p.m.Elapsed().Seconds(), 1e-3) / 1e6
}

// logState logs the state of the layers. The caller holds p.mu.
func (p *pullProgress) logState(note string) {
	if p.log == nil {
		return
	}
	done, got := p.counts()
	p.log.Info("image progress", slog.String("what", p.m.Label()), slog.Int("layers_done", done), slog.Int("layers", p.layers),
		slog.Int64("bytes", got), slog.Int64("total", p.total), slog.Float64("mb_per_s", p.rate()), slog.String("note", note))
}
