package ctl

import "fmt"

// CapBuffer keeps the head and the tail of a stream and counts what it
// dropped in between, so a huge output costs bounded memory yet its start
// (usually the command's own messages) and end (usually the error) survive.
type CapBuffer struct {
	limit int
	head  []byte
	tail  []byte // ring of the last limit-limit/2 bytes, filled after head
	start int    // index of the oldest byte in tail once it is full
	total int64
}

// NewCapBuffer returns a buffer that keeps at most limit bytes.
func NewCapBuffer(limit int) *CapBuffer {
	if limit < 2 {
		limit = 2
	}
	return &CapBuffer{limit: limit}
}

// Write never fails; it keeps the first limit/2 and the last limit/2 bytes.
func (b *CapBuffer) Write(p []byte) (int, error) {
	n := len(p)
	b.total += int64(n)
	headMax := b.limit / 2
	if room := headMax - len(b.head); room > 0 {
		k := min(room, len(p))
		b.head = append(b.head, p[:k]...)
		p = p[k:]
	}
	tailMax := b.limit - headMax
	for len(p) > 0 {
		if len(b.tail) < tailMax {
			k := min(tailMax-len(b.tail), len(p))
			b.tail = append(b.tail, p[:k]...)
			p = p[k:]
			continue
		}
		if len(p) >= tailMax {
			copy(b.tail, p[len(p)-tailMax:])
			b.start = 0
			p = nil
			break
		}
		for len(p) > 0 {
			k := copy(b.tail[b.start:], p)
			p = p[k:]
			b.start = (b.start + k) % tailMax
		}
	}
	return n, nil
}

// Total is the number of bytes written, kept or not.
func (b *CapBuffer) Total() int64 { return b.total }

// Truncated reports whether bytes were dropped.
func (b *CapBuffer) Truncated() bool { return b.total > int64(len(b.head)+len(b.tail)) }

// Bytes returns head and tail; when bytes were dropped a one-line marker
// saying how many stands between them.
func (b *CapBuffer) Bytes() []byte {
	out := make([]byte, 0, len(b.head)+len(b.tail)+64)
	out = append(out, b.head...)
	if b.Truncated() {
		dropped := b.total - int64(len(b.head)+len(b.tail))
		out = append(out, fmt.Sprintf("\n[... arbor: %d bytes omitted ...]\n", dropped)...)
	}
	out = append(out, b.tail[b.start:]...)
	out = append(out, b.tail[:b.start]...)
	return out
}
