package server

import (
	"fmt"
	"strings"
)

// Unified line diffs for the web view's diff of two states (statediff.go):
// Myers' O((N+M)D) algorithm on the lines left after the common head and
// tail, with D bounded (maxEdits); past it the middle is shown replaced
// whole, which is still a correct diff, only not the shortest.

// maxEdits bounds the edit distance searched for (its trace takes about
// maxEdits² ints).
const maxEdits = 1000

// diffContext is the lines of context around each change.
const diffContext = 3

// op is one line of an edit script: ' ' kept, '-' deleted from a, '+'
// inserted from b; i and j are the line's indexes in a and b.
type op struct {
	kind byte
	i, j int
}

// noEOL marks a last line without its newline, so that it differs from
// the same text with one (and prints the marker).
const noEOL = "\x00no newline"

// splitLines cuts s into lines, each without its "\n"; a last line
// without one ends in noEOL.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.Split(s, "\n")
	if lines[len(lines)-1] == "" {
		return lines[:len(lines)-1]
	}
	lines[len(lines)-1] += noEOL
	return lines
}

// editScript is a shortest edit script from a to b (or a correct one,
// past maxEdits).
func editScript(a, b []string) []op {
	var out []op
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		out = append(out, op{' ', pre, pre})
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	out = append(out, myers(a[pre:len(a)-suf], b[pre:len(b)-suf], pre)...)
	for k := suf; k > 0; k-- {
		out = append(out, op{' ', len(a) - k, len(b) - k})
	}
	return out
}

// myers is the edit script of a to b, whose lines are at off in the
// whole texts.
func myers(a, b []string, off int) []op {
	n, m := len(a), len(b)
	replace := func() []op {
		out := make([]op, 0, n+m)
		for i := range n {
			out = append(out, op{'-', off + i, off})
		}
		for j := range m {
			out = append(out, op{'+', off + n, off + j})
		}
		return out
	}
	if n == 0 || m == 0 {
		return replace()
	}
	maxD := min(n+m, maxEdits)
	width := 2*maxD + 1
	v := make([]int, width) // v[k+maxD]: furthest x on diagonal k
	var trace [][]int
	found := -1
	for d := 0; d <= maxD && found < 0; d++ {
		trace = append(trace, append([]int(nil), v...))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || k != d && v[k-1+maxD] < v[k+1+maxD] {
				x = v[k+1+maxD] // down: an insertion
			} else {
				x = v[k-1+maxD] + 1 // right: a deletion
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x, y = x+1, y+1
			}
			v[k+maxD] = x
			if x >= n && y >= m {
				found = d
				break
			}
		}
	}
	if found < 0 {
		return replace()
	}
	// Walk back through the trace: trace[d] is v before round d.
	var rev []op
	x, y := n, m
	for d := found; d > 0; d-- {
		pv := trace[d]
		k := x - y
		pk := k - 1 // a deletion led to diagonal k
		if k == -d || k != d && pv[k-1+maxD] < pv[k+1+maxD] {
			pk = k + 1 // an insertion
		}
		px := pv[pk+maxD]
		py := px - pk
		for x > px && y > py {
			x, y = x-1, y-1
			rev = append(rev, op{' ', off + x, off + y})
		}
		if pk == k+1 {
			y--
			rev = append(rev, op{'+', off + x, off + y})
		} else {
			x--
			rev = append(rev, op{'-', off + x, off + y})
		}
	}
	for x > 0 && y > 0 {
		x, y = x-1, y-1
		rev = append(rev, op{' ', off + x, off + y})
	}
	out := make([]op, len(rev))
	for i, o := range rev {
		out[len(rev)-1-i] = o
	}
	return out
}

// unified is the unified diff of a to b under the names na and nb
// ("" when they are equal).
func unified(na, nb, a, b string) string {
	if a == b {
		return ""
	}
	al, bl := splitLines(a), splitLines(b)
	ops := editScript(al, bl)
	var w strings.Builder
	fmt.Fprintf(&w, "--- %s\n+++ %s\n", na, nb)
	for i := 0; i < len(ops); {
		if ops[i].kind == ' ' {
			i++
			continue
		}
		// A hunk: diffContext lines before this change to diffContext
		// after the last change that follows closer than 2*diffContext.
		start, end := max(i-diffContext, 0), i
		for j := i; j < len(ops) && j-end <= 2*diffContext; j++ {
			if ops[j].kind != ' ' {
				end = j
			}
		}
		stop := min(end+diffContext+1, len(ops))
		var ca, cb int
		for _, o := range ops[start:stop] {
			if o.kind != '+' {
				ca++
			}
			if o.kind != '-' {
				cb++
			}
		}
		fmt.Fprintf(&w, "@@ -%s +%s @@\n", hunkRange(ops[start].i, ca), hunkRange(ops[start].j, cb))
		for _, o := range ops[start:stop] {
			text := ""
			if o.kind == '+' {
				text = bl[o.j]
			} else {
				text = al[o.i]
			}
			w.WriteByte(o.kind)
			if t, cut := strings.CutSuffix(text, noEOL); cut {
				w.WriteString(t + "\n\\ No newline at end of file\n")
			} else {
				w.WriteString(text + "\n")
			}
		}
		i = stop
	}
	return w.String()
}

// hunkRange is a hunk header's start,count (1-based; an empty range
// names the line before it).
func hunkRange(start, n int) string {
	switch n {
	case 0:
		return fmt.Sprintf("%d,0", start)
	case 1:
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}
