// Command forger is a test helper that runs inside a sandbox and attacks
// init's control channel the ways a hostile agent would (see
// docs/sandbox.md, "Control channel and grader integrity"). Tests copy a
// static build into the sandbox root (sandboxtest.Forger). Each mode
// writes what it managed to do to /tmp/forger-MODE.
//
//	forger [-docker-caps] status    fake status records, old and new format, to every fd of pid 1 and to the shell's sockets
//	forger [-docker-caps] signals   every signal 1-64 to pid 1, in a loop
//	forger [-docker-caps] pty       open every pty and every other process's fds 0-2 and 255, in a loop, and keep what opens
//	forger [-docker-caps] window    open the pty init holds in the test pause of ARBOR_TEST_PTY_HOLD=/tmp/pty-hold, and keep it
//	forger [-docker-caps] connect   look for init's control channel (the old socket path, /proc/1/fd, pidfd_getfd) and send it an exec request
//	forger [-docker-caps] rebind    bind /.arbor/ctl.sock (where an older init listened) with a socket that answers every request with a forged result
//	forger [-docker-caps] mqueue    make the POSIX message queue /forger holding one message, "hello", and exit: the queue lives on without a holder, and no checkpoint can take it (unrestorable_state)
//	forger [-docker-caps] mqheld    make the POSIX message queue /forger-held, remove its name, and hold it open until killed (a queue no listing of the namespace shows)
//	forger [-docker-caps] iouring   make an io_uring and hold it until killed (CRIU cannot dump one); /tmp/forger-iouring says whether the kernel gave one
//
// -docker-caps first drops every capability outside Docker's default set
// (as the hardened sandbox does), so the test shows what holds then.
package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dockerCaps is Docker's default capability set.
var dockerCaps = []uint{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_KILL,
	unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE, unix.CAP_NET_RAW,
	unix.CAP_SYS_CHROOT, unix.CAP_MKNOD, unix.CAP_AUDIT_WRITE, unix.CAP_SETFCAP,
}

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "-docker-caps" {
		if err := dropCaps(); err != nil {
			fail("drop caps: %v", err)
		}
		args = args[1:]
	}
	if len(args) != 1 {
		fail("usage: forger [-docker-caps] status|signals|pty|window|connect|rebind|mqueue|mqheld|iouring")
	}
	mode := args[0]
	switch mode {
	case "status":
		status()
	case "signals":
		signals()
	case "pty":
		pty()
	case "window":
		window()
	case "connect":
		connect()
	case "rebind":
		rebind()
	case "mqueue":
		mqueue()
	case "mqheld":
		mqheld()
	case "iouring":
		iouring()
	default:
		fail("unknown mode %q", mode)
	}
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "forger: "+format+"\n", a...)
	os.Exit(2)
}

// report overwrites /tmp/forger-MODE with one line.
func report(mode, format string, a ...any) {
	tmp := "/tmp/forger-" + mode + ".tmp"
	os.WriteFile(tmp, []byte(fmt.Sprintf(format, a...)+"\n"), 0o644)
	os.Rename(tmp, "/tmp/forger-"+mode)
}

func dropCaps() error {
	keep := uint64(0)
	for _, c := range dockerCaps {
		keep |= 1 << c
	}
	// Capabilities belong to threads: every thread of this Go process
	// must drop them (AllThreadsSyscall needs CGO_ENABLED=0).
	for c := uint(0); c <= 63; c++ {
		if keep&(1<<c) == 0 {
			// EINVAL past the kernel's last capability.
			syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	for i := range data {
		m := uint32(keep >> (32 * i))
		data[i].Effective &= m
		data[i].Permitted &= m
		data[i].Inheritable &= m
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return e
	}
	return nil
}

func nonce() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// payload is a burst of fake records: the old format ("SEQ EXIT PWD\036")
// and the new one with random and all-zero nonces, for guessed sequence
// numbers around round.
func payload(round int) []byte {
	var b strings.Builder
	base := (round % 20) * 10
	for seq := base; seq < base+20; seq++ {
		fmt.Fprintf(&b, "%d 0 /forged\036", seq)
		fmt.Fprintf(&b, "\036%s %d 0 /forged\036", nonce(), seq)
		fmt.Fprintf(&b, "\036%s %d 0 /forged\036", strings.Repeat("0", 32), seq)
	}
	return []byte(b.String())
}

func status() {
	var opened, writes, own int
	for round := 0; ; round++ {
		p := payload(round)
		ents, _ := os.ReadDir("/proc/1/fd")
		for _, e := range ents {
			fd, err := unix.Open("/proc/1/fd/"+e.Name(), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			opened++
			if n, _ := unix.Write(fd, p); n > 0 {
				writes++
			}
			unix.Close(fd)
		}
		// The sockets the shell holds, inherited by every process it
		// starts: the status socket and the command socket.
		for _, fd := range []int{196, 199} {
			if n, _ := unix.Write(fd, p); n > 0 {
				own++
			}
		}
		if round%50 == 0 {
			report("status", "rounds=%d proc1_opened=%d proc1_writes=%d own_socket_writes=%d", round+1, opened, writes, own)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func signals() {
	sent := 0
	for round := 0; ; round++ {
		for sig := 1; sig <= 64; sig++ {
			if unix.Kill(1, unix.Signal(sig)) == nil {
				sent++
			}
		}
		if round%50 == 0 {
			report("signals", "rounds=%d sent=%d", round+1, sent)
		}
		time.Sleep(time.Millisecond)
	}
}

// pty keeps every terminal it manages to open (one descriptor per
// terminal) and reports, each round, the ones on which a terminal ioctl
// still works: a descriptor of a pty whose master was closed is hung up
// (EIO) and harmless, a working one reaches the terminal of whoever uses it.
func pty() {
	self := os.Getpid()
	tries, opened := 0, 0
	held := map[uint64]int{} // rdev -> descriptor
	for round := 0; ; round++ {
		var paths []string
		if m, _ := filepath.Glob("/dev/pts/[0-9]*"); m != nil {
			paths = append(paths, m...)
		}
		paths = append(paths, "/dev/tty")
		procs, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range procs {
			pid, _ := strconv.Atoi(filepath.Base(p))
			if pid == self {
				continue
			}
			for _, fd := range []string{"0", "1", "2", "255"} {
				if link, err := os.Readlink(p + "/fd/" + fd); err == nil && strings.HasPrefix(link, "/dev/pts/") {
					paths = append(paths, p+"/fd/"+fd)
				}
			}
		}
		for _, path := range paths {
			tries++
			fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			// A /proc/PID/fd/N that pointed at the terminal when it was
			// read may point at a command's pipe or /dev/null by the time
			// it is opened (the shell redirects its own 0-2 while a
			// command runs): only a terminal counts.
			var st unix.Stat_t
			if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 136 {
				unix.Close(fd)
				continue
			}
			opened++
			f, _ := os.OpenFile("/tmp/forger-pty-opened", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			fmt.Fprintf(f, "opened %s (pts %d)\n", path, unix.Minor(st.Rdev))
			f.Close()
			if _, ok := held[st.Rdev]; ok {
				unix.Close(fd)
			} else {
				held[st.Rdev] = fd
			}
		}
		var live []string
		for rdev, fd := range held {
			if termWorks(fd) {
				live = append(live, strconv.Itoa(int(unix.Minor(rdev))))
			} else {
				// Hung up: harmless, let it go.
				delete(held, rdev)
				unix.Close(fd)
			}
		}
		report("pty", "rounds=%d tries=%d opened=%d live=[%s]", round+1, tries, opened, strings.Join(live, " "))
		time.Sleep(5 * time.Millisecond)
	}
}

// termWorks reports whether fd still reaches its terminal (TCGETS fails
// with EIO once the terminal was hung up). It neither reads nor writes, so
// it takes nothing from the terminal's user.
func termWorks(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// window waits for init's test pause (ARBOR_TEST_PTY_HOLD=/tmp/pty-hold:
// init has unlocked a new pty and not yet made it exclusive), opens that
// pty's slave, lets init go on and keeps the descriptor, reporting in
// /tmp/forger-window whether it still reaches the terminal.
func window() {
	const dir = "/tmp/pty-hold"
	var n string
	for {
		b, err := os.ReadFile(dir + "/pts")
		if err == nil && len(b) > 0 {
			n = string(b)
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	fd, err := unix.Open("/dev/pts/"+n, unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	os.WriteFile(dir+"/go", nil, 0o644)
	for round := 1; ; round++ {
		if err != nil {
			report("window", "rounds=%d pts=%s open=%v", round, n, err)
		} else {
			report("window", "rounds=%d pts=%s open=ok live=%v", round, n, termWorks(fd))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connect looks for a way to init's control channel: the socket path an
// older init listened on, every descriptor of pid 1 through /proc/1/fd
// (sockets never reopen there, and a non-dumpable init's fd directory is
// closed without CAP_SYS_PTRACE), and every descriptor of pid 1 with
// pidfd_getfd (ptrace rights over init). A socket it gets hold of is sent
// an exec request.
func connect() {
	path := "none"
	if c, err := net.Dial("unix", "/.arbor/ctl.sock"); err == nil {
		path = ask(c) // not init's: it listens on no path
	}
	var got []string
	opened, taken := 0, 0
	pfd, perr := unix.PidfdOpen(1, 0)
	for fd := 0; fd < 64; fd++ {
		if f, err := unix.Open(fmt.Sprintf("/proc/1/fd/%d", fd), unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
			opened++
			unix.Close(f)
		}
		if perr != nil {
			continue
		}
		nfd, err := unix.PidfdGetfd(pfd, fd, 0)
		if err != nil {
			continue
		}
		taken++
		f := os.NewFile(uintptr(nfd), "init-fd")
		if c, err := net.FileConn(f); err == nil {
			got = append(got, fmt.Sprintf("fd%d:%s", fd, ask(c)))
		}
		f.Close()
	}
	if perr == nil {
		unix.Close(pfd)
	}
	report("connect", "proc1_fd_opened=%d pidfd=%v pidfd_getfd=%d reached=%q path=%q", opened, perr == nil, taken, got, path)
}

// ask sends c an exec request and returns what came back.
func ask(c net.Conn) string {
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, `{"op":"exec","cmd":"echo pwned > /tmp/pwned"}`+"\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	return fmt.Sprintf("answer=%q err=%v", strings.TrimSpace(line), err)
}

func rebind() {
	os.Remove("/.arbor/ctl.sock")
	ln, err := net.Listen("unix", "/.arbor/ctl.sock")
	if err != nil {
		report("rebind", "listen: %v", err)
		return
	}
	report("rebind", "listening")
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func(c net.Conn) {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
				fmt.Fprintf(c, `{"stdout":"cHduZWQK","exit_code":0,"cwd":"/pwned","shell_pid":2}`+"\n")
			}
		}(c)
	}
}

// mqueue makes the POSIX message queue /forger with one message (a
// busybox sandbox has no tool for it): a queue needs no holder, and CRIU
// has no image for it.
func mqueue() {
	fd := mqOpen("forger")
	msg := []byte("hello")
	if _, _, errno := unix.Syscall6(unix.SYS_MQ_TIMEDSEND, fd, uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg)), 0, 0, 0); errno != 0 {
		fail("mq_timedsend /forger: %v", errno)
	}
	report("mqueue", "made /forger")
}

// mqheld makes the POSIX message queue /forger-held, removes its name and
// holds the queue open until killed.
func mqheld() {
	mqOpen("forger-held")
	name, _ := unix.BytePtrFromString("forger-held")
	if _, _, errno := unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0); errno != 0 {
		fail("mq_unlink /forger-held: %v", errno)
	}
	report("mqheld", "holding /forger-held")
	for {
		time.Sleep(time.Hour)
	}
}

// mqOpen creates (or opens) the POSIX message queue /name for writing.
func mqOpen(name string) uintptr {
	p, err := unix.BytePtrFromString(name) // mq_open's name, without its "/"
	if err != nil {
		fail("mq_open /%s: %v", name, err)
	}
	fd, _, errno := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), unix.O_CREAT|unix.O_WRONLY, 0o600, 0, 0, 0)
	if errno != 0 {
		fail("mq_open /%s: %v", name, errno)
	}
	return fd
}

// iouring makes an io_uring and holds it until killed.
func iouring() {
	var params [120]byte // struct io_uring_params, zeroed
	_, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		report("iouring", "refused: %v", errno)
		os.Exit(1)
	}
	report("iouring", "holding an io_uring")
	for {
		time.Sleep(time.Hour)
	}
}
