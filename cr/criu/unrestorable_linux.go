package criu

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/internal/procfs"
	"github.com/arbor-env/arbor/state"
)

// posixQueues lists the names of the POSIX message queues of the IPC
// namespace of the host pid pid, sorted ("/q1"). It does not read them:
// reading a queue's file moves its times, and the env runs on. CRIU has no image for them: a dump leaves them out and a
// restore would bring the namespace back without them (docs/inspector.md,
// "Kernel state coverage", ipc:mqueue). Sandboxes mount no mqueue file
// system, and a queue needs no holder to live on, so the namespace's own
// is read through a mount of it that is never attached anywhere
// (fsopen, fsmount): the mqueue file system takes the IPC namespace of
// the thread that opens it, so this thread enters the sandbox's for the
// fsopen only. It must come back, never end in the sandbox's namespace:
// a thread that ends takes the sandboxes it started with it (their init
// has a parent-death signal).
func posixQueues(pid int) ([]string, error) {
	fs, err := openMqueueFS(pid)
	if errors.Is(err, unix.ENODEV) {
		return nil, nil // a kernel without POSIX message queues
	}
	if err != nil {
		return nil, fmt.Errorf("list POSIX message queues of pid %d: %w", pid, err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, fmt.Errorf("list POSIX message queues of pid %d: create mqueue: %w", pid, err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOEXEC|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("list POSIX message queues of pid %d: mount mqueue: %w", pid, err)
	}
	defer unix.Close(mnt)
	// The mount's descriptor is a path only: its root is opened to read.
	dfd, err := unix.Openat(mnt, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("list POSIX message queues of pid %d: open mqueue: %w", pid, err)
	}
	root := os.NewFile(uintptr(dfd), "mqueue")
	defer root.Close()
	names, err := root.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list POSIX message queues of pid %d: %w", pid, err)
	}
	for i, n := range names {
		names[i] = "/" + n
	}
	slices.Sort(names)
	return names, nil
}

// openMqueueFS opens a new mqueue file system context in the IPC
// namespace of pid: on this goroutine's thread, which enters that
// namespace for the fsopen and goes back to its own.
func openMqueueFS(pid int) (fd int, err error) {
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/ipc", pid))
	if err != nil {
		return -1, fmt.Errorf("open ipc namespace: %w", err)
	}
	defer target.Close()
	runtime.LockOSThread()
	own, err := os.Open("/proc/thread-self/ns/ipc")
	if err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("open own ipc namespace: %w", err)
	}
	defer own.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWIPC); err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("enter ipc namespace: %w", err)
	}
	fd, ferr := unix.Fsopen("mqueue", unix.FSOPEN_CLOEXEC)
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWIPC); err != nil {
		// The thread stays locked to this goroutine rather than go
		// back to the runtime in the sandbox's namespace.
		if ferr == nil {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("leave ipc namespace: %w", err)
	}
	runtime.UnlockOSThread()
	if ferr != nil {
		return -1, fmt.Errorf("open mqueue: %w", ferr) // ENODEV: none in this kernel
	}
	return fd, nil
}

// mqueueMagic is the mqueue file system's magic number (linux/magic.h).
const mqueueMagic = 0x19800202

// undumpable are the descriptor kinds CRIU cannot dump, by their link
// target (docs/inspector.md, "Kernel objects": the dump fails).
var undumpable = map[string]string{
	"anon_inode:[io_uring]":    "io_uring",
	"anon_inode:[userfaultfd]": "userfaultfd",
	"anon_inode:[perf_event]":  "perf_event",
	"anon_inode:bpf-prog":      "BPF program",
}

// MaxDescriptors bounds the descriptors the processes of a tree may hold
// for a dump: past it the dump is refused as the agent's doing
// (cr.ErrAgentState), before CRIU runs. 50 processes holding 20000
// descriptors each (a shell's loop and a fork, seconds of an agent's
// turn) made every dump run into CRIU's timeout, two minutes of a core
// each, and fail as the server's checkpoint_failed, an infra error a
// trainer masks (TestAgentOutcomes).
const MaxDescriptors = 1 << 16

// heldUndumpable lists the descriptors the processes among tasks (a
// tree's) hold that CRIU cannot dump, its own failure then
// reading as the server's: POSIX message queues, whether or not they
// still have a name ("POSIX message queue /q1 held by pid 5 (server) fd
// 3"), and the kinds of undumpable. A tree holding more than
// MaxDescriptors fails with cr.ErrAgentState.
func heldUndumpable(tasks []hostTask) ([]string, error) {
	var held []string
	left := MaxDescriptors
	for _, t := range tasks {
		if t.tid != t.pid {
			continue
		}
		dir := fmt.Sprintf("/proc/%d/fd", t.pid)
		names, err := procfs.ReadDirNamesMax(dir, left)
		if gone(err) {
			continue
		}
		if errors.Is(err, procfs.ErrTooLarge) {
			return nil, fmt.Errorf("%w: the sandbox's processes hold more than %d descriptors (pid %d among them), too many to checkpoint: close them before the turn ends",
				cr.ErrAgentState, MaxDescriptors, t.nsPID)
		}
		if err != nil {
			return nil, fmt.Errorf("list descriptors of pid %d: %w", t.pid, err)
		}
		left -= len(names)
		for _, name := range names {
			fd := dir + "/" + name
			target, err := os.Readlink(fd)
			if err != nil {
				continue // closed meanwhile
			}
			what := ""
			if kind, ok := undumpable[target]; ok {
				what = kind + " descriptor"
			} else if strings.HasPrefix(target, "pipe:") || strings.HasPrefix(target, "socket:") || strings.HasPrefix(target, "anon_inode:") {
				continue // not a file an mqueue could be
			} else if st := (unix.Statfs_t{}); unix.Statfs(fd, &st) == nil && st.Type == mqueueMagic {
				what = "POSIX message queue " + target
			} else {
				continue
			}
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", t.pid))
			held = append(held, fmt.Sprintf("%s held by pid %d (%s) fd %s", what, t.nsPID, strings.TrimSpace(string(comm)), name))
		}
	}
	return held, nil
}

// RefuseUnrestorable fails with state.ErrUnrestorableState, naming each
// one, when the IPC namespace of the host pid pid, the root of a
// sandbox's tree, holds POSIX message queues, or a process of the tree
// holds one open, or another descriptor CRIU cannot dump
// (heldUndumpable). Dump calls it; so does a checkpoint that keeps an
// earlier process image (no image holds such state, so a state taken
// while it lives would be restored without it).
func RefuseUnrestorable(pid int) error {
	tasks, err := treeTasks(pid)
	if err != nil {
		return err
	}
	return refuseUnrestorable(pid, tasks)
}

// refuseUnrestorable is RefuseUnrestorable of the tree whose tasks the
// caller listed.
func refuseUnrestorable(pid int, tasks []hostTask) error {
	q, err := posixQueues(pid)
	if err != nil {
		return err
	}
	var what []string
	for _, n := range q {
		what = append(what, "POSIX message queue "+n)
	}
	held, err := heldUndumpable(tasks)
	if err != nil {
		return err
	}
	if what = append(what, held...); len(what) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: CRIU cannot restore it", state.ErrUnrestorableState, strings.Join(what, ", "))
}
