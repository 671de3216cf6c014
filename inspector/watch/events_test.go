package watch

import (
	"slices"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/bpf"
)

func ev(nr uint32, flags uint32, paths ...string) bpf.Event {
	e := bpf.Event{Type: bpf.EventSyscall, Nr: nr, Flags: flags, TGID: 7}
	copy(e.Path[:], paths)
	return e
}

func TestEventPaths(t *testing.T) {
	const (
		openat, unlinkat, renameat2, mmap, ioctl, ioUringSetup, mkdir, symlinkat = 257, 263, 316, 9, 16, 425, 83, 266
	)
	fd := uint32(bpf.FlagFDFile | bpf.FlagPath1)
	tests := []struct {
		name  string
		e     bpf.Event
		want  []string
		unacc string
	}{
		{name: "open for write", e: ev(openat, fd, "", "/work/a"), want: []string{"/work/a"}},
		{name: "memfd", e: ev(1, fd|bpf.FlagOutside1, "", "/memfd:x"), want: nil},
		{name: "relative", e: ev(unlinkat, bpf.FlagPath0|bpf.FlagPath1, "x/y", "/work"), want: []string{"/work/x/y"}},
		{name: "relative to root", e: ev(mkdir, bpf.FlagPath0|bpf.FlagPath1, "d", "/"), want: []string{"/d"}},
		{name: "absolute", e: ev(mkdir, bpf.FlagPath0, "/tmp/d"), want: []string{"/tmp/d"}},
		{name: "empty path means the dirfd", e: ev(280, bpf.FlagPath0|bpf.FlagPath1, "", "/work/f"), want: []string{"/work/f"}},
		{name: "rename", e: ev(renameat2, bpf.FlagPath0|bpf.FlagPath1|bpf.FlagPath2|bpf.FlagPath3, "a", "/w", "/x/b", "/w"), want: []string{"/w/a", "/x/b"}},
		{name: "symlink", e: ev(symlinkat, bpf.FlagPath2|bpf.FlagPath3, "", "", "s", "/w"), want: []string{"/w/s"}},
		// A write to /proc changes a process (or the kernel) that need not
		// run for it: no snapshot holds it, and the turn is full.
		{name: "a write to proc is unaccounted", e: ev(openat, fd, "", "/proc/1/oom_score_adj"), unacc: "write to /proc/1/oom_score_adj"},
		{name: "a user path in proc is not in snapshots", e: ev(mkdir, bpf.FlagPath0, "/proc/x"), want: nil},
		{name: "outside base", e: ev(unlinkat, bpf.FlagPath0|bpf.FlagPath1|bpf.FlagOutside1, "f", "/"), want: nil},
		{name: "shared mapping", e: ev(mmap, fd, "", "/db"), unacc: "shared writable mapping of /db"},
		{name: "io_uring", e: ev(ioUringSetup, 0), unacc: "io_uring"},
		{name: "truncated", e: ev(mkdir, bpf.FlagPath0|bpf.FlagTrunc, "/x"), unacc: "too long"},
		{name: "no fd", e: ev(1, bpf.FlagNoFD), unacc: "did not resolve"},
		{name: "unknown base", e: ev(mkdir, bpf.FlagPath0, "rel"), unacc: "unknown"},
		{name: "fork", e: bpf.Event{Type: bpf.EventFork}, want: nil},
	}
	clone := ev(ioctl, fd, "", "/work/f")
	clone.Arg = 0x40049409
	tests = append(tests, struct {
		name  string
		e     bpf.Event
		want  []string
		unacc string
	}{name: "reflink", e: clone, want: []string{"/work/f"}})
	chattr := clone
	chattr.Arg = 0x40086602
	tests = append(tests, struct {
		name  string
		e     bpf.Event
		want  []string
		unacc string
	}{name: "chattr", e: chattr, unacc: "ioctl"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := EventPaths(tt.e)
			if !slices.Equal(got, tt.want) {
				t.Errorf("paths %q, want %q", got, tt.want)
			}
			if (tt.unacc == "") != (why == "") || !strings.Contains(why, tt.unacc) {
				t.Errorf("unaccounted %q, want %q", why, tt.unacc)
			}
		})
	}
}
