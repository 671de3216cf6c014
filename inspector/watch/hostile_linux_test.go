package watch_test

import (
	"strings"
	"testing"

	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/inspector/watch"
	"github.com/arbor-env/arbor/state"
)

// TestScanIsBounded: an agent whose processes hold more descriptors than
// the scan bound does not make the server read them all every turn; its
// turns that need them read (a pipeline: the holders of its pipe are
// looked for, as are those of the output channels) are unaccounted, full,
// with the reason naming the process.
// The same turns under the default bound are none: the bound, not the
// descriptors, made them full. Likewise a shell past MaxShellFDs has an
// unknown state (its turns dump it) instead of a table read whole.
func TestScanIsBounded(t *testing.T) {
	// A sleeper holding 300 descriptors of /dev/null.
	const hold = `sh -c 'i=10; while [ $i -lt 310 ]; do eval "exec $i</dev/null"; i=$((i+1)); done; exec sleep 3000' >/dev/null 2>&1 & sleep 0.2`
	for _, tt := range []struct {
		name    string
		max     int
		want    state.Kind
		overMsg bool
	}{
		{name: "default bound", max: 0, want: state.None},
		{name: "bound of 200", max: 200, want: state.Full, overMsg: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, newEBPF(t, watch.Options{MaxScan: tt.max}))
			res, _ := r.turn(hold)
			if !res.Kind.Has(state.Proc) {
				t.Fatalf("starting the holder: %s %v, want proc", res.Kind, res.Reasons)
			}
			r.checkpoint(res.Kind)
			for _, cmd := range []string{"echo a | cat >/dev/null", "ls / | wc -l >/dev/null"} {
				res, _ = r.turn(cmd)
				if res.Kind != tt.want {
					t.Errorf("%q: %s %v, want %s", cmd, res.Kind, res.Reasons, tt.want)
				}
				over := strings.Contains(strings.Join(res.Reasons, "; "), "(sleep) are past the turn's scan bound")
				if over != tt.overMsg {
					t.Errorf("%q's reasons %q: naming the sleeper past the scan bound is %v, want %v", cmd, res.Reasons, over, tt.overMsg)
				}
				r.checkpoint(res.Kind)
			}
		})
	}
	t.Run("shell past MaxShellFDs", func(t *testing.T) {
		r := newRig(t, newEBPF(t, watch.Options{}))
		// From 200 up: 196-199 are the shell's own channels (a command
		// that closes them gets its shell restarted).
		open := `ulimit -n 8192 && i=200; while [ $i -lt 4400 ]; do eval "exec $i</dev/null"; i=$((i+1)); done; unset i`
		res, _ := r.turn(open)
		if !res.Kind.Has(state.Proc) || !strings.Contains(strings.Join(res.Reasons, "; "), "larger than the bound") {
			t.Fatalf("shell opening %d descriptors: %s %v, want proc, its state unknown past the bound", 4200, res.Kind, res.Reasons)
		}
		r.checkpoint(res.Kind)
		// Its state stays unknown while it holds them: every turn dumps.
		if res, _ := r.turn("true"); !res.Kind.Has(state.Proc) {
			t.Errorf("next turn: %s %v, want proc", res.Kind, res.Reasons)
		}
		if inspector.MaxShellFDs >= 4200 {
			t.Fatalf("MaxShellFDs %d: the test's shell no longer passes it", inspector.MaxShellFDs)
		}
	})
}
