package bpf_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/bpf"
)

// openTracker opens the tracker or skips the test with the reason.
func openTracker(t *testing.T) *bpf.Tracker {
	t.Helper()
	tr, err := bpf.Open()
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		t.Fatalf("the verifier refused the programs: %+v", ve)
	}
	if errors.Is(err, bpf.ErrUnavailable) {
		t.Skipf("eBPF unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// newCgroup makes a v2 cgroup for the test and returns an open fd of it and
// its id.
func newCgroup(t *testing.T) (*os.File, uint64) {
	t.Helper()
	root := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		root = "/sys/fs/cgroup"
	}
	dir := filepath.Join(root, fmt.Sprintf("arbor-bpftest-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("make a v2 cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return f, st.Ino
}

func TestEventsOfTrackedCgroup(t *testing.T) {
	tr := openTracker(t)
	cg, id := newCgroup(t)
	if err := tr.Track(id); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := `cd "$1" && echo a > f && echo b >> f && mkdir -p d/e && mv f d/g && ln -s d/g s && chmod 600 d/g && rm s && cat d/g >/dev/null && sh -c 'exit 0' && kill -0 $$ &&
python3 -c 'import os, socket
socket.socket(socket.AF_UNIX).bind("sock")
socket.socket(socket.AF_UNIX).bind("\0abstract")
os.kill(os.getpid(), 18)'`
	cmd := exec.Command("/bin/sh", "-c", script, "sh", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// A process outside the cgroup must not show up.
	if err := os.WriteFile(filepath.Join(dir, "outside"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	done := make(chan struct{})
	var forks, execs, exits int
	go func() {
		defer close(done)
		for {
			e, err := tr.Read()
			if err != nil {
				return
			}
			if e.CgroupID != id {
				t.Errorf("event of cgroup %d, want only %d", e.CgroupID, id)
			}
			switch e.Type {
			case bpf.EventFork:
				forks++
			case bpf.EventExec:
				execs++
			case bpf.EventExit:
				exits++
			case bpf.EventSyscall:
				name := bpf.Syscall[e.Nr]
				if e.Flags&bpf.FlagFDFile != 0 {
					if strings.HasPrefix(e.Path[1], dir) {
						got[name+" "+strings.TrimPrefix(e.Path[1], dir)]++
					}
					continue
				}
				p := e.Path[0]
				if p != "" && !strings.HasPrefix(p, "/") {
					p = e.Path[1] + "/" + p
				}
				q := e.Path[2]
				if q != "" && !strings.HasPrefix(q, "/") {
					q = e.Path[3] + "/" + q
				}
				got[strings.TrimSpace(name+" "+strings.TrimPrefix(p, dir)+" "+strings.TrimPrefix(q, dir))]++
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	tr.Flush()
	<-done
	// bind of a socket to a path names it; an abstract one is no file.
	otherBinds := 0
	for k, n := range got {
		if (k == "bind" || strings.HasPrefix(k, "bind ")) && k != "bind /sock" {
			otherBinds += n
		}
	}
	if got["bind /sock"] != 1 || otherBinds != 0 {
		t.Errorf("bind /sock reported %d times (want 1), other binds (the abstract one) %d (want 0); got %v", got["bind /sock"], otherBinds, got)
	}
	for _, want := range []string{"openat /f", "write /f", "mkdir /d", "mkdir /d/e", "renameat2 /f /d/g", "symlinkat  /s", "fchmodat /d/g", "unlinkat /s"} {
		if got[want] == 0 {
			t.Errorf("no event %q; got %v", want, got)
		}
	}
	// Writes are reported once per process, fd and open file per turn;
	// the open itself names the file anyway.
	if got["write /f"] < 1 || got["openat /f"] != 2 {
		t.Errorf("write /f reported %d times, openat /f %d times", got["write /f"], got["openat /f"])
	}
	for k := range got {
		if strings.Contains(k, "outside") {
			t.Errorf("saw %q from outside the cgroup", k)
		}
	}
	if forks < 2 || execs < 2 || exits < 3 {
		t.Errorf("forks %d execs %d exits %d", forks, execs, exits)
	}
	if n, err := tr.Lost(); err != nil || n != 0 {
		t.Errorf("lost %d events (%v)", n, err)
	}
}

// BenchmarkWriteHeavy measures what tracking costs a write-heavy command:
// dd writing 20000 blocks of 512 bytes into a file, in an untracked and in
// a tracked cgroup (every write passes sys_enter and sys_exit; one event is
// emitted per open file and turn).
func BenchmarkWriteHeavy(b *testing.B) {
	tr, err := bpf.Open()
	if err != nil {
		b.Skipf("eBPF unavailable: %v", err)
	}
	defer tr.Close()
	go func() {
		for {
			if _, err := tr.Read(); errors.Is(err, bpf.ErrClosed) {
				return
			}
		}
	}()
	root := "/sys/fs/cgroup/unified"
	dir := filepath.Join(root, fmt.Sprintf("arbor-bpfbench-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatalf("make a v2 cgroup: %v", err)
	}
	defer os.Remove(dir)
	cg, err := os.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer cg.Close()
	var st unix.Stat_t
	unix.Fstat(int(cg.Fd()), &st)
	out := filepath.Join(b.TempDir(), "big")
	run := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			cmd := exec.Command("dd", "if=/dev/zero", "of="+out, "bs=512", "count=20000", "status=none")
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
			if o, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%v: %s", err, o)
			}
		}
	}
	b.Run("untracked", run)
	if err := tr.Track(st.Ino); err != nil {
		b.Fatal(err)
	}
	b.Run("tracked", run)
	time.Sleep(10 * time.Millisecond)
}

// TestStreamAndEffectEvents: a pipe between two processes of the cgroup
// gives stream events with the pipe's inode; calls that change another
// process or an IPC object give one effect event per number and epoch;
// the same calls aimed at the caller itself give none.
func TestStreamAndEffectEvents(t *testing.T) {
	tr := openTracker(t)
	cg, id := newCgroup(t)
	if err := tr.Track(id); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		streams map[uint32]int // mode type -> events
		effects map[string]int
	}
	run := func(script string) seen {
		t.Helper()
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", script, err, out)
		}
		s := seen{streams: map[uint32]int{}, effects: map[string]int{}}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				e, err := tr.Read()
				if err != nil {
					return
				}
				switch {
				case e.Type != bpf.EventSyscall:
				case e.Flags&bpf.FlagStream != 0:
					if e.Ino == 0 {
						t.Errorf("stream event of %s without an inode", bpf.Syscall[e.Nr])
					}
					s.streams[e.Mode&unix.S_IFMT]++
				case e.Flags&bpf.FlagEffect != 0:
					s.effects[bpf.Syscall[e.Nr]]++
				}
			}
		}()
		time.Sleep(50 * time.Millisecond)
		tr.Flush()
		<-done
		if err := tr.NewEpoch(id); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// The last: a shell in a pid namespace signals itself by its own
	// number there (1), not the host's.
	self := run(`taskset -c 0 true && prlimit --nofile=100:100 true && kill -0 $$ && nice -n 1 true &&
unshare --pid --fork sh -c 'trap "" USR1; kill -USR1 $$'`)
	for _, name := range []string{"sched_setaffinity", "prlimit64", "kill", "setpriority"} {
		if n := self.effects[name]; n != 0 {
			t.Errorf("%s aimed at the caller reported %d times", name, n)
		}
	}
	if self.streams[unix.S_IFIFO] != 0 {
		t.Errorf("stream events without a pipe between the cgroup's processes: %v", self.streams)
	}
	other := run(`sleep 30 & p=$!; taskset -p 1 $p >/dev/null; taskset -p 1 $p >/dev/null; renice -n 2 -p $p >/dev/null; kill $p
unshare --ipc sh -c 'ipcmk -Q >/dev/null'; echo hello | cat >/dev/null`)
	for _, name := range []string{"sched_setaffinity", "setpriority", "kill", "msgget"} {
		if n := other.effects[name]; n != 1 {
			t.Errorf("%s on another process or an IPC object reported %d times, want once per epoch; all: %v", name, n, other.effects)
		}
	}
	if other.streams[unix.S_IFIFO] < 2 {
		t.Errorf("a pipe written and read gave %d stream events, want the write and the read", other.streams[unix.S_IFIFO])
	}
	if n, err := tr.Lost(); err != nil || n != 0 {
		t.Errorf("lost %d events (%v)", n, err)
	}
}
