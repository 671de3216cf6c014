package seccomp

// MaskedValue is one masked-equality test on the low 32 bits of a syscall
// argument: (arg & Mask) == Value.
type MaskedValue struct{ Mask, Value uint32 }

// Matches reports whether the low 32 bits of v pass the test.
func (m MaskedValue) Matches(v uint64) bool { return uint32(v)&m.Mask == m.Value }

// AllBut returns masked-equality tests whose union is every 32-bit value
// except those in excluded: a prefix cover, one test per subtree of the
// binary trie that holds no excluded value (about 32 per excluded value).
//
// The ioctl rule needs it: libseccomp ignores a conditional rule for a
// syscall that also has an unconditional one, so "allow ioctl but not
// TIOCSTI" is spelled as allow rules for every other command. The kernel
// truncates ioctl's cmd to 32 bits, so the tests look at those alone; a
// comparison of the whole 64-bit argument would let 1<<32|TIOCSTI through.
func AllBut(excluded []uint32) []MaskedValue {
	var out []MaskedValue
	var walk func(prefix uint32, depth int, ex []uint32)
	walk = func(prefix uint32, depth int, ex []uint32) {
		if len(ex) == 0 {
			out = append(out, MaskedValue{Mask: topBits(depth), Value: prefix})
			return
		}
		if depth == 32 {
			return // an excluded value itself
		}
		bit := uint32(1) << uint(31-depth)
		var zero, one []uint32
		for _, v := range ex {
			if v&bit != 0 {
				one = append(one, v)
			} else {
				zero = append(zero, v)
			}
		}
		walk(prefix, depth+1, zero)
		walk(prefix|bit, depth+1, one)
	}
	walk(0, 0, dedup(excluded))
	return out
}

func topBits(n int) uint32 {
	if n == 0 {
		return 0
	}
	return ^uint32(0) << uint(32-n)
}

func dedup(vs []uint32) []uint32 {
	seen := map[uint32]bool{}
	var out []uint32
	for _, v := range vs {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
