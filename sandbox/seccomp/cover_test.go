package seccomp

import (
	"math/rand"
	"testing"
)

func TestAllBut(t *testing.T) {
	const tiocsti, tioclinux = 0x5412, 0x541C
	tests := []struct {
		name     string
		excluded []uint32
		maxRules int
	}{
		{"nothing", nil, 1},
		{"one value", []uint32{tiocsti}, 32},
		{"the two tty ioctls", []uint32{tiocsti, tioclinux}, 40},
		{"zero and all ones", []uint32{0, ^uint32(0)}, 64},
		{"duplicates", []uint32{7, 7, 7}, 32},
	}
	rng := rand.New(rand.NewSource(1))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := AllBut(tt.excluded)
			if len(rules) > tt.maxRules {
				t.Errorf("%d rules, want at most %d", len(rules), tt.maxRules)
			}
			ex := map[uint32]bool{}
			for _, v := range tt.excluded {
				ex[v] = true
			}
			probe := []uint64{0, 1, 0x5411, 0x5413, 0x541B, 0x541D, 0xffffffff, 1 << 31}
			for _, v := range tt.excluded {
				// the value itself, its neighbours and the same low 32 bits
				// with junk above (the kernel truncates ioctl's cmd)
				probe = append(probe, uint64(v), uint64(v)+1, uint64(v)-1, 1<<32|uint64(v), 0xdead<<40|uint64(v))
			}
			for i := 0; i < 2000; i++ {
				probe = append(probe, rng.Uint64())
			}
			for _, v := range probe {
				n := 0
				for _, r := range rules {
					if r.Matches(v) {
						n++
					}
				}
				want := 1
				if ex[uint32(v)] {
					want = 0
				}
				if n != want {
					t.Fatalf("value %#x matches %d rules, want %d", v, n, want)
				}
			}
		})
	}
}
