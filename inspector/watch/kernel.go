package watch

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/bpf"
)

// maxObjects bounds the stream objects an env keeps between process
// checkpoints; past it the next checkpoint takes the processes.
const maxObjects = 4096

// Object is an open file a stream call went through (a pipe, FIFO or
// socket, a file locked or reconfigured with fcntl or flock) or a file
// outside the sandbox's tree written (a memory file): its queue, locks or
// contents belong to whichever process holds it open, and a process
// outliving the turn that holds it makes the turn at least proc.
type Object struct {
	Ino  uint64
	Mode uint32 // i_mode: the type bits tell a pipe from a socket
	Call string // the syscall
	PID  uint32 // the caller's process id (host)
	FD   int32
}

// kind names the object's type the way /proc/PID/fd names it.
func (o Object) kind() string {
	switch o.Mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "pipe"
	case unix.S_IFSOCK:
		return "socket"
	}
	return "file"
}

func (o Object) String() string {
	return fmt.Sprintf("%s of %s:[%d] by process %d (fd %d)", o.Call, o.kind(), o.Ino, o.PID, o.FD)
}

// EventKernel returns what event e says about kernel state outside the
// file tree: the reason an effect call makes the turn proc (effect), or
// full (unaccounted: a call that may change files the tracer cannot
// follow, asynchronous I/O among them), or a stream object. ok is false
// for events of files and processes, which EventPaths reads.
func EventKernel(e bpf.Event) (effect, unaccounted string, obj *Object, ok bool) {
	if e.Type != bpf.EventSyscall {
		return "", "", nil, false
	}
	name := bpf.Syscall[e.Nr]
	if name == "" {
		name = fmt.Sprintf("syscall %d", e.Nr)
	}
	switch {
	case e.Flags&bpf.FlagEffect != 0:
		if why, ok := unaccountedCalls[name]; ok {
			return "", fmt.Sprintf("%s (%s by process %d)", why, name, e.TGID), nil, true
		}
		if bpf.ClassOf(e.Nr) == bpf.ClassUnknown {
			return fmt.Sprintf("%s by process %d, a call not known to leave no state", name, e.TGID), "", nil, true
		}
		return fmt.Sprintf("%s by process %d (argument %d)", name, e.TGID, int64(e.Arg)), "", nil, true
	case e.Flags&bpf.FlagStream != 0:
		return "", "", &Object{Ino: e.Ino, Mode: e.Mode, Call: name, PID: e.TGID, FD: e.DirFD[0]}, true
	case e.Flags&bpf.FlagFDFile != 0 && e.Flags&bpf.FlagOutside1 != 0 && e.Flags&bpf.FlagNoFD == 0 &&
		e.Mode&unix.S_IFMT == unix.S_IFREG && e.Nr != nrMmap && e.Nr != nrIoctl:
		// A write to a regular file outside the tree: a memory file
		// (memfd, also when reopened through /proc/PID/fd) or a file of
		// another mount namespace. Its contents live with its holders.
		return "", "", &Object{Ino: e.Ino, Mode: e.Mode, Call: name, PID: e.TGID, FD: e.DirFD[0]}, true
	}
	return "", "", nil, false
}
