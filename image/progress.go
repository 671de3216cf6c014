package image

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/term"
)

// progress reports a pull or an import: layers done, bytes, rate. On a
// terminal it redraws one line; otherwise (and in the log) it writes a
// line per layer and at most one every progressEvery while bytes flow.
type progress struct {
	mu     sync.Mutex
	w      io.Writer
	log    *slog.Logger
	what   string
	tty    bool
	start  time.Time
	last   time.Time
	sizes  []int64 // per layer, as shipped (0: unknown)
	got    []int64
	done   []bool
	total  int64
	moved  int64 // bytes read, retries included
	layers int
}

const progressEvery = 2 * time.Second

func newProgress(w io.Writer, log *slog.Logger, what string) *progress {
	if w == nil {
		w = io.Discard
	}
	p := &progress{w: w, log: log, what: what}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty = true
	}
	return p
}

func (p *progress) begin(n int, ls []v1.Layer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.start, p.last = time.Now(), time.Now()
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
func (p *progress) skip(i int, size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done[i] = true
	p.got[i] = size
	p.line(fmt.Sprintf("layer %d/%d already stored", i+1, p.layers), true)
}

func (p *progress) add(i int, n int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got[i] += n
	p.moved += n
	if time.Since(p.last) >= progressEvery || (p.tty && time.Since(p.last) >= 200*time.Millisecond) {
		p.line("", false)
	}
}

// unpacked marks layer i as stored.
func (p *progress) unpacked(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done[i] = true
	p.line(fmt.Sprintf("layer %d/%d unpacked", i+1, p.layers), true)
}

// retry forgets what layer i had read: it starts again.
func (p *progress) retry(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got[i] = 0
	p.line(fmt.Sprintf("layer %d/%d failed, trying again", i+1, p.layers), true)
}

func (p *progress) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.done {
		p.done[i] = true
	}
	p.line("done", true)
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

// line writes the state, with note, to the terminal or the writer and the
// log. The caller holds p.mu.
func (p *progress) line(note string, always bool) {
	p.last = time.Now()
	var got int64
	done := 0
	for i := range p.got {
		got += p.got[i]
		if p.done[i] {
			done++
		}
	}
	secs := max(time.Since(p.start).Seconds(), 1e-3)
	rate := float64(p.moved) / secs / 1e6
	s := fmt.Sprintf("%s: layers %d/%d, %.1f", p.what, done, p.layers, float64(got)/1e6)
	if p.total > 0 {
		s += fmt.Sprintf("/%.1f", float64(p.total)/1e6)
	}
	s += fmt.Sprintf(" MB, %.1f MB/s", rate)
	if note != "" {
		s += ", " + note
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", s)
	} else if always || note == "" {
		fmt.Fprintln(p.w, s)
	}
	if p.log != nil && (always || !p.tty) {
		p.log.Info("image progress", slog.String("what", p.what), slog.Int("layers_done", done), slog.Int("layers", p.layers),
			slog.Int64("bytes", got), slog.Int64("total", p.total), slog.Float64("mb_per_s", rate), slog.String("note", note))
	}
}
