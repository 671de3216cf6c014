package watch

import (
	"github.com/arbor-env/arbor/inspector"

	"fmt"
	"strings"

	"github.com/arbor-env/arbor/bpf"
)

// ioctls that change a file's contents the way a write does: the fd's
// path is touched and compared like any other.
var cloneIoctls = map[uint64]bool{
	0x40049409: true, // FICLONE
	0x4020940d: true, // FICLONERANGE
	0xc0189436: true, // FIDEDUPERANGE
}

// ioctls that only read, and may succeed on files or directories.
var readIoctls = map[uint64]bool{
	0x1: true, 0x2: true, // FIBMAP, FIGETBSZ
	0x541b: true, 0x5421: true, 0x5450: true, 0x5451: true, 0x5452: true, // FIONREAD, FIONBIO, FIONCLEX, FIOCLEX, FIOASYNC
	0x80086601: true, 0x80087601: true, // FS_IOC_GETFLAGS, FS_IOC_GETVERSION
	0xc020660b: true, 0x801c581f: true, // FS_IOC_FIEMAP, FS_IOC_FSGETXATTR
	0x80046601: true, 0x80047601: true, // the 32-bit GETFLAGS, GETVERSION
}

// Syscall numbers (x86_64) EventPaths treats specially.
const (
	nrMmap  = 9
	nrIoctl = 16
)

// unaccountedCalls are syscalls whose effect on the file tree the inspector
// cannot follow.
var unaccountedCalls = map[string]string{
	"io_uring_setup": "io_uring", "io_uring_enter": "io_uring", "io_uring_register": "io_uring",
	"mount": "mount", "umount2": "mount", "move_mount": "mount", "fsmount": "mount",
	"open_tree": "mount", "mount_setattr": "mount", "pivot_root": "mount",
	"chroot": "chroot", "swapon": "swapon",
	"fsopen": "mount", "fsconfig": "mount", "fspick": "mount", "open_tree_attr": "mount",
	// Asynchronous I/O writes files with no write call; quotas and file
	// attributes set by file_setattr are not compared.
	"io_setup": "aio", "io_submit": "aio", "quotactl": "quota", "quotactl_fd": "quota",
	"file_setattr": "file attributes",
	// ptrace and process_vm_writev change another process, which need not
	// run for it (docs/inspector.md, "What a restore brings back").
	"ptrace": "ptrace", "process_vm_writev": "process_vm_writev",
}

// timesCalls set a file's times: a directory's mtime they set is
// compared (inspector.DirTimesDiffer).
var timesCalls = map[string]bool{"utime": true, "utimes": true, "futimesat": true, "utimensat": true}

// EventPaths returns the sandbox paths (absolute, not yet cleaned: ".."
// and symlinks are resolved against a root later) that event e may have
// changed, or why it cannot be accounted for. Process events touch no path.
func EventPaths(e bpf.Event) (paths []string, unaccounted string) {
	if e.Type != bpf.EventSyscall {
		return nil, ""
	}
	name := bpf.Syscall[e.Nr]
	if name == "" {
		name = fmt.Sprintf("syscall %d", e.Nr)
	}
	if why, ok := unaccountedCalls[name]; ok {
		return nil, fmt.Sprintf("%s (%s by process %d)", why, name, e.TGID)
	}
	if e.Flags&bpf.FlagTrunc != 0 {
		return nil, fmt.Sprintf("path of %s by process %d too long or unreadable", name, e.TGID)
	}
	if e.Flags&bpf.FlagNoFD != 0 {
		return nil, fmt.Sprintf("fd %d of %s by process %d did not resolve", e.DirFD[0], name, e.TGID)
	}
	if e.Flags&bpf.FlagFDFile != 0 {
		if e.Flags&bpf.FlagOutside1 != 0 {
			return nil, "" // memfd, pipe, a file of another mount namespace
		}
		p := e.Path[1]
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Sprintf("file of fd %d in %s by process %d unresolved", e.DirFD[0], name, e.TGID)
		}
		switch e.Nr {
		case nrMmap:
			return nil, fmt.Sprintf("shared writable mapping of %s by process %d", p, e.TGID)
		case nrIoctl:
			if readIoctls[e.Arg] {
				return nil, ""
			}
			if !cloneIoctls[e.Arg] {
				return nil, fmt.Sprintf("ioctl %#x on %s by process %d", e.Arg, p, e.TGID)
			}
		}
		if p == "/proc" || strings.HasPrefix(p, "/proc/") {
			// /proc/PID/mem, oom_score_adj, comm...: state of a process
			// that need not run for it, or of the kernel.
			return nil, fmt.Sprintf("write to %s in %s by process %d", p, name, e.TGID)
		}
		return inspector.SnapshotPath(p), ""
	}
	for i := 0; i < 2; i++ {
		user, base := 2*i, 2*i+1
		uflag, bflag, oflag := uint32(bpf.FlagPath0), uint32(bpf.FlagPath1), uint32(bpf.FlagOutside1)
		if i == 1 {
			uflag, bflag, oflag = bpf.FlagPath2, bpf.FlagPath3, bpf.FlagOutside3
		}
		if e.Flags&(uflag|bflag) == 0 {
			continue
		}
		rel := e.Path[user]
		if e.Flags&uflag != 0 && strings.HasPrefix(rel, "/") {
			paths = append(paths, inspector.SnapshotPath(rel)...)
			continue
		}
		if e.Flags&bflag == 0 {
			return nil, fmt.Sprintf("base directory of %q in %s by process %d unknown", rel, name, e.TGID)
		}
		if e.Flags&oflag != 0 {
			continue // relative to a directory outside the sandbox
		}
		p := e.Path[base]
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Sprintf("base directory of %q in %s by process %d unresolved", rel, name, e.TGID)
		}
		if rel != "" {
			p = strings.TrimSuffix(p, "/") + "/" + rel
		}
		paths = append(paths, inspector.SnapshotPath(p)...)
	}
	return paths, ""
}
