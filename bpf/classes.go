package bpf

import (
	"strconv"
	"strings"
)

// Class says what the tracer does with a syscall of the sandbox's tasks
// (docs/inspector.md, "Syscall classes"). Every x86_64 syscall the kernel
// headers name has one; a number the table lacks (a syscall newer than the
// table) is ClassUnknown, which the programs treat as ClassEffect: a turn
// is left without a checkpoint only when all it did is known to leave no
// state a restore would lose.
type Class uint8

// The classes, as numbered in tracker.c.
const (
	// ClassUnknown: not in the table; reported like ClassEffect.
	ClassUnknown Class = iota
	// ClassPure changes nothing that outlives the calling process, or
	// only what the turn-end probes read (its own memory, descriptors,
	// signals, credentials, cwd; a long-lived process that makes it has
	// run, which makes the turn proc anyway).
	ClassPure
	// ClassFile may change a file: reported with its paths.
	ClassFile
	// ClassStream reads, writes or reconfigures a descriptor's open file:
	// reported (once per descriptor and turn) when it is a pipe, FIFO or
	// socket, or for fcntl locks and flock any file, so that user space
	// can tell whether a process that outlives the turn holds it (queued
	// data a restore would bring back or lose).
	ClassStream
	// ClassEffect changes a kernel object outside the calling process:
	// IPC objects, another process's scheduling, signals to others, the
	// clock, keyrings. Reported by number, once per turn; calls aimed at
	// the caller itself are pure.
	ClassEffect
)

// String names c.
func (c Class) String() string {
	switch c {
	case ClassPure:
		return "pure"
	case ClassFile:
		return "file"
	case ClassStream:
		return "stream"
	case ClassEffect:
		return "effect"
	}
	return "unknown"
}

// MaxSyscall bounds the syscall numbers the class map holds.
const MaxSyscall = 512

// SyscallInfo is a syscall's name and class.
type SyscallInfo struct {
	Name  string
	Class Class
}

// Syscalls is every x86_64 syscall by number, with its class. Stream and
// effect calls are listed with the reason in docs/inspector.md.
var Syscalls = func() map[uint32]SyscallInfo {
	m := map[uint32]SyscallInfo{}
	for c, list := range map[Class]string{
		ClassFile: `1 write 2 open 9 mmap 16 ioctl 18 pwrite64 20 writev 40 sendfile 49 bind
			76 truncate 77 ftruncate 82 rename 83 mkdir 84 rmdir 85 creat 86 link 87 unlink 88 symlink
			90 chmod 91 fchmod 92 chown 93 fchown 94 lchown 101 ptrace 132 utime 133 mknod
			155 pivot_root 161 chroot 165 mount 166 umount2 167 swapon 188 setxattr 189 lsetxattr
			190 fsetxattr 197 removexattr 198 lremovexattr 199 fremovexattr 235 utimes 257 openat
			258 mkdirat 259 mknodat 260 fchownat 261 futimesat 263 unlinkat 264 renameat 265 linkat
			266 symlinkat 268 fchmodat 275 splice 280 utimensat 285 fallocate 296 pwritev
			304 open_by_handle_at 311 process_vm_writev 316 renameat2 326 copy_file_range 328 pwritev2
			425 io_uring_setup 426 io_uring_enter 427 io_uring_register 428 open_tree 429 move_mount
			432 fsmount 437 openat2 442 mount_setattr 452 fchmodat2 463 setxattrat 466 removexattrat`,
		ClassStream: `0 read 19 readv 42 connect 43 accept 44 sendto 45 recvfrom 46 sendmsg 47 recvmsg
			48 shutdown 50 listen 54 setsockopt 72 fcntl 73 flock 276 tee 278 vmsplice 288 accept4
			299 recvmmsg 307 sendmmsg`,
		ClassEffect: `29 shmget 30 shmat 31 shmctl 62 kill 64 semget 65 semop 66 semctl 67 shmdt
			68 msgget 69 msgsnd 70 msgrcv 71 msgctl 103 syslog 129 rt_sigqueueinfo 134 uselib
			141 setpriority 142 sched_setparam 144 sched_setscheduler 153 vhangup 156 _sysctl
			159 adjtimex 163 acct 164 settimeofday 168 swapoff 169 reboot 170 sethostname
			171 setdomainname 174 create_module 175 init_module 176 delete_module 177 get_kernel_syms
			178 query_module 179 quotactl 180 nfsservctl 181 getpmsg 182 putpmsg 183 afs_syscall
			184 tuxcall 185 security 200 tkill 203 sched_setaffinity 206 io_setup 207 io_destroy
			208 io_getevents 209 io_submit 210 io_cancel 212 lookup_dcookie 214 epoll_ctl_old
			215 epoll_wait_old 220 semtimedop 227 clock_settime 234 tgkill 236 vserver 240 mq_open
			241 mq_unlink 242 mq_timedsend 243 mq_timedreceive 244 mq_notify 245 mq_getsetattr
			246 kexec_load 248 add_key 249 request_key 250 keyctl 251 ioprio_set 256 migrate_pages
			279 move_pages 297 rt_tgsigqueueinfo 298 perf_event_open 300 fanotify_init 301 fanotify_mark
			302 prlimit64 305 clock_adjtime 313 finit_module 314 sched_setattr 320 kexec_file_load
			321 bpf 333 io_pgetevents 424 pidfd_send_signal 430 fsopen 431 fsconfig 433 fspick
			440 process_madvise 443 quotactl_fd 448 process_mrelease 467 open_tree_attr 469 file_setattr`,
		ClassPure: `3 close 4 stat 5 fstat 6 lstat 7 poll 8 lseek 10 mprotect 11 munmap 12 brk
			13 rt_sigaction 14 rt_sigprocmask 15 rt_sigreturn 17 pread64 21 access 22 pipe 23 select
			24 sched_yield 25 mremap 26 msync 27 mincore 28 madvise 32 dup 33 dup2 34 pause 35 nanosleep
			36 getitimer 37 alarm 38 setitimer 39 getpid 41 socket 51 getsockname 52 getpeername
			53 socketpair 55 getsockopt 56 clone 57 fork 58 vfork 59 execve 60 exit 61 wait4 63 uname
			74 fsync 75 fdatasync 78 getdents 79 getcwd 80 chdir 81 fchdir 89 readlink 95 umask
			96 gettimeofday 97 getrlimit 98 getrusage 99 sysinfo 100 times 102 getuid 104 getgid
			105 setuid 106 setgid 107 geteuid 108 getegid 109 setpgid 110 getppid 111 getpgrp 112 setsid
			113 setreuid 114 setregid 115 getgroups 116 setgroups 117 setresuid 118 getresuid
			119 setresgid 120 getresgid 121 getpgid 122 setfsuid 123 setfsgid 124 getsid 125 capget
			126 capset 127 rt_sigpending 128 rt_sigtimedwait 130 rt_sigsuspend 131 sigaltstack
			135 personality 136 ustat 137 statfs 138 fstatfs 139 sysfs 140 getpriority 143 sched_getparam
			145 sched_getscheduler 146 sched_get_priority_max 147 sched_get_priority_min
			148 sched_rr_get_interval 149 mlock 150 munlock 151 mlockall 152 munlockall 154 modify_ldt
			157 prctl 158 arch_prctl 160 setrlimit 162 sync 172 iopl 173 ioperm 186 gettid 187 readahead
			191 getxattr 192 lgetxattr 193 fgetxattr 194 listxattr 195 llistxattr 196 flistxattr
			201 time 202 futex 204 sched_getaffinity 205 set_thread_area 211 get_thread_area
			213 epoll_create 216 remap_file_pages 217 getdents64 218 set_tid_address 219 restart_syscall
			221 fadvise64 222 timer_create 223 timer_settime 224 timer_gettime 225 timer_getoverrun
			226 timer_delete 228 clock_gettime 229 clock_getres 230 clock_nanosleep 231 exit_group
			232 epoll_wait 233 epoll_ctl 237 mbind 238 set_mempolicy 239 get_mempolicy 247 waitid
			252 ioprio_get 253 inotify_init 254 inotify_add_watch 255 inotify_rm_watch 262 newfstatat
			267 readlinkat 269 faccessat 270 pselect6 271 ppoll 272 unshare 273 set_robust_list
			274 get_robust_list 277 sync_file_range 281 epoll_pwait 282 signalfd 283 timerfd_create
			284 eventfd 286 timerfd_settime 287 timerfd_gettime 289 signalfd4 290 eventfd2
			291 epoll_create1 292 dup3 293 pipe2 294 inotify_init1 295 preadv 303 name_to_handle_at
			306 syncfs 308 setns 309 getcpu 310 process_vm_readv 312 kcmp 315 sched_getattr 317 seccomp
			318 getrandom 319 memfd_create 322 execveat 323 userfaultfd 324 membarrier 325 mlock2
			327 preadv2 329 pkey_mprotect 330 pkey_alloc 331 pkey_free 332 statx 334 rseq 434 pidfd_open
			435 clone3 436 close_range 438 pidfd_getfd 439 faccessat2 441 epoll_pwait2
			444 landlock_create_ruleset 445 landlock_add_rule 446 landlock_restrict_self 447 memfd_secret
			449 futex_waitv 450 set_mempolicy_home_node 451 cachestat 453 map_shadow_stack 454 futex_wake
			455 futex_wait 456 futex_requeue 457 statmount 458 listmount 459 lsm_get_self_attr
			460 lsm_set_self_attr 461 lsm_list_modules 462 mseal 464 getxattrat 465 listxattrat
			468 file_getattr`,
	} {
		f := strings.Fields(list)
		for i := 0; i+1 < len(f); i += 2 {
			n, err := strconv.ParseUint(f[i], 10, 32)
			if err != nil {
				panic("bpf: bad syscall number " + f[i])
			}
			if _, dup := m[uint32(n)]; dup {
				panic("bpf: syscall " + f[i] + " classed twice")
			}
			m[uint32(n)] = SyscallInfo{Name: f[i+1], Class: c}
		}
	}
	return m
}()

// Syscall names the x86_64 syscalls by number.
var Syscall = func() map[uint32]string {
	m := make(map[uint32]string, len(Syscalls))
	for n, s := range Syscalls {
		m[n] = s.Name
	}
	return m
}()

// ClassOf returns the class of syscall nr (ClassUnknown when the table
// lacks it).
func ClassOf(nr uint32) Class { return Syscalls[nr].Class }
