package inspector

import (
	"regexp"
	"testing"
)

// TestKernelObject keeps kernelObject's scan equal to the pattern it
// replaced, ^([a-z_]+):\[[0-9]+\]$, on the names /proc/PID/fd gives and
// on names close to them.
func TestKernelObject(t *testing.T) {
	re := regexp.MustCompile(`^([a-z_]+):\[[0-9]+\]$`)
	for _, tt := range []struct{ name, in string }{
		{"pipe", "pipe:[1234]"},
		{"socket", "socket:[99]"},
		{"anon inode", "anon_inode:[eventfd]"},
		{"anon inode bpf", "anon_inode:bpf-map"},
		{"path", "/work/log"},
		{"path like an object", "/a:[1]"},
		{"deleted", "/tmp/x (deleted)"},
		{"no number", "pipe:[]"},
		{"no bracket", "pipe:[12"},
		{"upper case", "Pipe:[1]"},
		{"trailing", "pipe:[1]x"},
		{"twice", "a:[1]:[2]"},
		{"empty kind", ":[1]"},
		{"empty", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kind, ok := kernelObject(tt.in)
			m := re.FindStringSubmatch(tt.in)
			if ok != (m != nil) || ok && kind != m[1] {
				t.Errorf("kernelObject(%q) = %q, %v; the pattern says %q", tt.in, kind, ok, m)
			}
		})
	}
}
