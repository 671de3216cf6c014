//go:build linux && cgo

package seccomp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

var dockerCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
	"CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP"}

// TestMain doubles as the child of TestFilter: with ARBOR_SECCOMP_CHILD
// set it loads the filter into itself (and only itself) and reports what
// a few calls return.
func TestMain(m *testing.M) {
	if os.Getenv("ARBOR_SECCOMP_CHILD") != "" {
		child()
		return
	}
	os.Exit(m.Run())
}

func child() {
	runtime.LockOSThread() // the filter is per thread; every probe runs here
	p, err := Compile(dockerCaps, nil)
	if err != nil {
		fmt.Println("compile:", err)
		os.Exit(1)
	}
	n := len(p.BPF) / 8
	filters := make([]unix.SockFilter, n)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&filters[0])), len(p.BPF)), p.BPF)
	prog := unix.SockFprog{Len: uint16(n), Filter: &filters[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println("nnp:", err)
		os.Exit(1)
	}
	master, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		fmt.Println("ptmx:", err)
		os.Exit(1)
	}
	c := byte('x')
	ioctl := func(cmd uint64) error {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(master), uintptr(cmd), uintptr(unsafe.Pointer(&c)))
		if e != 0 {
			return e
		}
		return nil
	}
	var ws unix.Winsize
	report := func(name string, err error) {
		switch {
		case err == nil:
			fmt.Println(name, "ok")
		case errors.Is(err, unix.EPERM):
			fmt.Println(name, "EPERM")
		default:
			fmt.Println(name, "other")
		}
	}
	// Without the filter the kernel lets this process (CAP_SYS_ADMIN)
	// push a byte into its own pty: an EPERM below is the filter's.
	report("TIOCSTI-unfiltered", ioctl(unix.TIOCSTI))
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); e != 0 {
		fmt.Println("load:", e)
		os.Exit(1)
	}
	report("TIOCSTI", ioctl(unix.TIOCSTI))
	report("TIOCSTI|1<<32", ioctl(1<<32|unix.TIOCSTI))
	report("TIOCLINUX", ioctl(unix.TIOCLINUX))
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws)))
	report("TIOCGWINSZ", errnoErr(e))
	report("mount", unix.Mount("none", "/", "tmpfs", 0, ""))
	report("unshare-user", unix.Unshare(unix.CLONE_NEWUSER))
	report("getpid", nil)
	os.Exit(0)
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// TestFilter loads the compiled filter into a child process and checks
// what it denies: terminal input injection (also with junk in the upper
// half of ioctl's cmd, which the kernel ignores), mount and user
// namespaces; and that ordinary calls still work.
func TestFilter(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skip("no /dev/ptmx")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "ARBOR_SECCOMP_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	want := "TIOCSTI-unfiltered ok\nTIOCSTI EPERM\nTIOCSTI|1<<32 EPERM\nTIOCLINUX EPERM\nTIOCGWINSZ ok\nmount EPERM\nunshare-user EPERM\ngetpid ok\n"
	if string(out) != want {
		t.Fatalf("child reported:\n%s\nwant:\n%s", out, want)
	}
}

func TestCompile(t *testing.T) {
	p, err := Compile(dockerCaps, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Instructions() < 100 {
		t.Fatalf("%d instructions: not Docker's profile", p.Instructions())
	}
	again, _ := Compile(append([]string{}, dockerCaps[1:]...), nil)
	if again == p {
		t.Fatal("a different cap set got the cached program of another")
	}
	same, _ := Compile([]string{dockerCaps[1], dockerCaps[0]}, nil)
	same2, _ := Compile([]string{dockerCaps[0], dockerCaps[1]}, nil)
	if same != same2 {
		t.Fatal("the same set in another order was compiled again")
	}
	// CAP_SYS_ADMIN adds mount and friends to the profile: a longer program.
	admin, err := Compile(append(append([]string{}, dockerCaps...), "CAP_SYS_ADMIN"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if admin.Instructions() == p.Instructions() {
		t.Fatal("the profile did not change with CAP_SYS_ADMIN")
	}
	for _, s := range p.Skipped {
		if strings.TrimSpace(s) == "" || s == "ioctl" {
			t.Fatalf("skipped %q", s)
		}
	}
	if v, err := LibraryVersion(); err != nil || v == "" {
		t.Fatalf("library version %q, %v", v, err)
	}
}
