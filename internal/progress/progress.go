// Package progress shows people how far a long operation (an image build,
// preparing tasks, filling a warm pool) has got: on a terminal one line
// redrawn in place, elsewhere (logs, pipes) a line per step, at most a few
// per second. A nil writer makes every call a no-op, so libraries can take
// an optional io.Writer and report unconditionally.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Meter counts the steps of one operation.
type Meter struct {
	w     io.Writer
	tty   bool
	label string
	total int
	start time.Time
	every time.Duration
	now   func() time.Time

	mu       sync.Mutex
	done     int
	note     string
	last     time.Time
	finished bool
}

// New starts a meter for an operation of total steps (0 when unknown)
// writing to w; w may be nil.
func New(w io.Writer, label string, total int) *Meter {
	m := &Meter{w: w, label: label, total: total, every: 250 * time.Millisecond, now: time.Now}
	m.start = m.now()
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			m.tty = true
			m.every = 50 * time.Millisecond
		}
	}
	return m
}

// Label is what the meter reports on.
func (m *Meter) Label() string { return m.label }

// Elapsed is the time since the meter started.
func (m *Meter) Elapsed() time.Duration { return m.now().Sub(m.start) }

// Add records n more steps done; note (may be empty) says what the last
// one was.
func (m *Meter) Add(n int, note string) {
	m.change(func() {
		m.done += n
		m.note = note
		if t := m.now(); t.Sub(m.last) >= m.every || (m.total > 0 && m.done >= m.total) {
			m.last = t
			m.draw(false)
		}
	})
}

// Step reports a phase without counting a step (e.g. "running setup 2/5").
func (m *Meter) Step(note string) { m.Add(0, note) }

// Event reports a phase that must be seen (a layer done, a retry): it is
// drawn at once, whatever the rate limit.
func (m *Meter) Event(note string) {
	m.change(func() {
		m.note = note
		m.last = m.now()
		m.draw(false)
	})
}

// Finish writes the final line: "done" with the time taken, or the error.
func (m *Meter) Finish(err error) {
	if err != nil {
		m.FinishNote("failed: " + err.Error())
		return
	}
	m.FinishNote("done")
}

// FinishNote is Finish with the final line's note given.
func (m *Meter) FinishNote(note string) {
	m.change(func() {
		m.finished = true
		m.note = note
		m.draw(true)
	})
}

// change runs f under the meter's lock, unless the meter has no writer
// or has finished.
func (m *Meter) change(f func()) {
	if m == nil || m.w == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.finished {
		f()
	}
}

// draw writes the current line; m.mu is held.
func (m *Meter) draw(final bool) {
	var b strings.Builder
	if m.tty {
		b.WriteString("\r\033[K")
	}
	b.WriteString(m.label)
	if m.total > 0 {
		fmt.Fprintf(&b, " %s %d/%d", bar(m.done, m.total, 20), m.done, m.total)
	} else if m.done > 0 {
		fmt.Fprintf(&b, " %d", m.done)
	}
	fmt.Fprintf(&b, " %s", m.now().Sub(m.start).Round(10*time.Millisecond))
	if m.note != "" {
		b.WriteString(" ")
		b.WriteString(m.note)
	}
	if !m.tty || final {
		b.WriteString("\n")
	}
	io.WriteString(m.w, b.String())
}

func bar(done, total, width int) string {
	k := min(width, max(0, done*width/total))
	return "[" + strings.Repeat("#", k) + strings.Repeat(".", width-k) + "]"
}
