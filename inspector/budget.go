package inspector

import "sync/atomic"

// DefaultMaxRead is the file content (bytes, both trees counted) that the
// comparisons of one classification read at most (docs/inspector.md,
// "Bounded comparisons"). A file past it counts as changed.
const DefaultMaxRead int64 = 256 << 20

// Budget is the file content a set of comparisons (one turn's) may still
// read. A comparison takes its bytes before it reads them; a file whose
// content the budget cannot cover is not proven equal and counts as
// changed: that costs a checkpoint, never a wrong skip. Safe for
// concurrent use.
type Budget struct {
	left     atomic.Int64
	read     atomic.Int64
	unproven atomic.Int64
	// afterChunk, set by tests, runs after each chunk read (in the
	// comparison's goroutine).
	afterChunk func()
}

// NewBudget returns a budget of limit bytes; with 0 or less no content is
// read, and every regular file whose metadata match counts as changed.
func NewBudget(limit int64) *Budget {
	b := &Budget{}
	b.left.Store(max(limit, 0))
	return b
}

// Read is the number of bytes the comparisons charged to b have read.
func (b *Budget) Read() int64 { return b.read.Load() }

// Unproven is the number of files that counted as changed because b could
// not cover their content.
func (b *Budget) Unproven() int64 { return b.unproven.Load() }

// covers reports whether n more bytes fit in what is left, without
// taking them.
func (b *Budget) covers(n int64) bool { return n <= b.left.Load() }

// take takes n bytes from b, or nothing and false when fewer are left.
func (b *Budget) take(n int64) bool {
	for {
		left := b.left.Load()
		if n > left {
			return false
		}
		if b.left.CompareAndSwap(left, left-n) {
			return true
		}
	}
}
