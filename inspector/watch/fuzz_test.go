package watch

import (
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/state"

	"strings"
	"testing"

	"github.com/arbor-env/arbor/bpf"
)

// FuzzEventRules feeds arbitrary ring buffer records through decoding, the
// path rules and classification: nothing may panic, every path must be
// absolute, and a turn with a fact is never "none".
func FuzzEventRules(f *testing.F) {
	rec := make([]byte, bpf.EventSize)
	rec[16] = 1   // syscall
	rec[20] = 0x1 // write
	rec[56] = bpf.FlagFDFile | bpf.FlagPath1
	copy(rec[80+1024:], "/work/a")
	f.Add(rec)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < bpf.EventSize {
			b = append(b, make([]byte, bpf.EventSize-len(b))...)
		}
		e, err := bpf.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		paths, why := EventPaths(e)
		var facts []inspector.Fact
		for _, p := range paths {
			if !strings.HasPrefix(p, "/") {
				t.Fatalf("relative path %q from %+v", p, e)
			}
			facts = append(facts, inspector.Fact{Kind: inspector.FileChanged, Path: p})
		}
		if why != "" {
			facts = append(facts, inspector.Fact{Kind: inspector.Unaccounted, Detail: why})
		}
		r := inspector.Classify(facts)
		if len(facts) > 0 && r.Kind == state.None {
			t.Fatalf("facts %v classified none", facts)
		}
		if why != "" && r.Kind != state.Full {
			t.Fatalf("unaccounted %q classified %s", why, r.Kind)
		}
	})
}
