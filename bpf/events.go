package bpf

import (
	"bytes"
	"fmt"
	"unsafe"
)

// EventType says what an Event reports.
type EventType uint32

// Event types, as numbered in tracker.c.
const (
	EventSyscall EventType = 1
	EventFork    EventType = 2
	EventExec    EventType = 3
	EventExit    EventType = 4
)

// Event flags, as in tracker.c.
const (
	FlagPath0    = 1 << 0 // Path[0]: a path string from the task's memory
	FlagPath1    = 1 << 1 // Path[1]: a path the kernel resolved
	FlagPath2    = 1 << 2 // Path[2]: a second path string
	FlagPath3    = 1 << 3 // Path[3]: the kernel-resolved base of Path[2]
	FlagTrunc    = 1 << 4 // a path did not fit or could not be read
	FlagOutside1 = 1 << 5 // Path[1] is not below the task's root (memfd, pipe, other mount ns)
	FlagOutside3 = 1 << 6
	FlagFDFile   = 1 << 7 // Path[1] is the file an fd refers to, not a base directory
	FlagNoFD     = 1 << 8 // an fd did not resolve to a file
)

// EventSize is the size of one ring buffer record: struct event of
// tracker.c, whose layout bpf2go generates as trackerEvent.
const EventSize = int(unsafe.Sizeof(trackerEvent{}))

// Event is one record from the kernel.
type Event struct {
	// TS is CLOCK_MONOTONIC in ns when the call returned.
	TS       uint64
	CgroupID uint64
	Type     EventType
	// Nr is the x86_64 syscall number (EventSyscall).
	Nr   uint32
	PID  uint32 // thread id
	TGID uint32 // process id
	Ret  int64
	// Arg: open flags, ioctl command, mmap protection, the child's pid of
	// a fork.
	Arg   uint64
	DirFD [2]int32
	Flags uint32
	// Mode, Ino and Dev describe the inode behind an fd (FlagFDFile).
	Mode uint32
	Ino  uint64
	Dev  uint32
	// Path holds up to four strings; Flags says which are set.
	Path [4]string
}

// Decode parses a ring buffer record: the record's bytes are struct event
// of tracker.c in host byte order, copied into bpf2go's trackerEvent.
func Decode(b []byte) (Event, error) {
	if len(b) < EventSize {
		return Event{}, fmt.Errorf("decode event of %d bytes: %w", len(b), ErrShortEvent)
	}
	var r trackerEvent
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&r)), EventSize), b)
	e := Event{
		TS: r.Ts, CgroupID: r.Cgid, Type: EventType(r.Type), Nr: r.Nr, PID: r.Pid, TGID: r.Tgid,
		Ret: r.Ret, Arg: r.Arg, DirFD: r.Dirfd, Flags: r.Flags, Mode: r.Mode, Ino: r.Ino, Dev: r.Dev,
	}
	for i := range r.Path {
		s := unsafe.Slice((*byte)(unsafe.Pointer(&r.Path[i][0])), len(r.Path[i]))
		if n := bytes.IndexByte(s, 0); n >= 0 {
			s = s[:n]
		}
		e.Path[i] = string(s)
	}
	return e, nil
}

// Syscall names the x86_64 syscalls the programs report.
var Syscall = map[uint32]string{
	1: "write", 2: "open", 9: "mmap", 16: "ioctl", 18: "pwrite64", 20: "writev",
	40: "sendfile", 76: "truncate", 77: "ftruncate", 82: "rename", 83: "mkdir",
	84: "rmdir", 85: "creat", 86: "link", 87: "unlink", 88: "symlink", 90: "chmod",
	91: "fchmod", 92: "chown", 93: "fchown", 94: "lchown", 132: "utime", 133: "mknod",
	155: "pivot_root", 161: "chroot", 165: "mount", 166: "umount2", 167: "swapon",
	188: "setxattr", 189: "lsetxattr", 190: "fsetxattr", 197: "removexattr",
	198: "lremovexattr", 199: "fremovexattr", 235: "utimes", 257: "openat",
	258: "mkdirat", 259: "mknodat", 260: "fchownat", 261: "futimesat", 263: "unlinkat",
	264: "renameat", 265: "linkat", 266: "symlinkat", 268: "fchmodat", 275: "splice",
	280: "utimensat", 285: "fallocate", 296: "pwritev", 304: "open_by_handle_at",
	316: "renameat2", 326: "copy_file_range", 328: "pwritev2", 425: "io_uring_setup",
	426: "io_uring_enter", 427: "io_uring_register", 428: "open_tree", 429: "move_mount",
	432: "fsmount", 437: "openat2", 442: "mount_setattr", 452: "fchmodat2",
	463: "setxattrat", 466: "removexattrat",
	49: "bind", 101: "ptrace", 311: "process_vm_writev",
}
