package bpf_test

import (
	"bufio"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/bpf"
)

// TestClassesCoverKernelHeaders: every syscall the installed kernel
// headers name has a class under that name, so a syscall added to the
// kernel's table fails here until it is classed (unclassed, the programs
// treat it as an effect: safe, but it costs skips).
func TestClassesCoverKernelHeaders(t *testing.T) {
	const hdr = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"
	f, err := os.Open(hdr)
	if err != nil {
		t.Fatalf("kernel headers (linux-libc-dev, make deps): %v", err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^#define __NR_(\w+) (\d+)$`)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		nr, _ := strconv.ParseUint(m[2], 10, 32)
		n++
		s, ok := bpf.Syscalls[uint32(nr)]
		switch {
		case !ok:
			t.Errorf("syscall %d %s has no class", nr, m[1])
		case s.Name != m[1]:
			t.Errorf("syscall %d is %s in %s, %s in the table", nr, m[1], hdr, s.Name)
		case s.Class == bpf.ClassUnknown:
			t.Errorf("syscall %d %s is unknown", nr, m[1])
		}
	}
	if n < 300 {
		t.Fatalf("read %d syscalls from %s", n, hdr)
	}
	for nr := range bpf.Syscalls {
		if nr >= bpf.MaxSyscall {
			t.Errorf("syscall %d is past MaxSyscall", nr)
		}
	}
}

// TestFileClassIsTheTracedSet: the file class is exactly the calls
// tracker.c's interesting() stashes for a path event.
func TestFileClassIsTheTracedSet(t *testing.T) {
	src, err := os.ReadFile("tracker.c")
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	i := strings.Index(s, "static __always_inline int interesting(long nr)")
	if i < 0 {
		t.Fatal("interesting() not found in tracker.c")
	}
	body := s[i : i+strings.Index(s[i:], "return 0;")]
	traced := map[string]bool{}
	for _, m := range regexp.MustCompile(`case NR_(\w+):`).FindAllStringSubmatch(body, -1) {
		traced[m[1]] = true
	}
	for nr, c := range bpf.Syscalls {
		if (c.Class == bpf.ClassFile) != traced[c.Name] {
			t.Errorf("syscall %d %s: class %v, traced for paths %v", nr, c.Name, c.Class, traced[c.Name])
		}
		delete(traced, c.Name)
	}
	for name := range traced {
		t.Errorf("tracker.c traces %s, which the table lacks", name)
	}
}
