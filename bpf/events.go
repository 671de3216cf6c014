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
	// FlagStream: a stream call (ClassStream, or a write to a pipe, FIFO
	// or socket): Mode, Ino and Dev describe the fd's file, DirFD[0] is
	// the fd; no path.
	FlagStream = 1 << 9
	// FlagEffect: an effect call (ClassEffect or unknown), by number; Arg
	// is its first argument.
	FlagEffect = 1 << 10
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
