//go:build ignore

// tracker.c: eBPF programs that report every syscall that can change a file
// tree, plus process fork/exec/exit, for the tasks of tracked cgroups.
//
// Arguments are stashed at raw_tracepoint/sys_enter in a per-task hash map
// and the event is built at raw_tracepoint/sys_exit, where the return value
// is known: failed calls change nothing and are dropped. Paths the kernel
// already resolved (the file behind an fd, the cwd or dirfd a relative path
// is relative to) are written by walking dentries up to the task's root, so
// user space never has to look at /proc of a task that may have exited.
// Only x86_64 syscall numbers are handled (bpf2go -target amd64).

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Minimal kernel types; CO-RE relocates their fields against the running
// kernel's BTF.
struct pt_regs {
	unsigned long r10, r8, r9, dx, si, di, orig_ax;
} __attribute__((preserve_access_index));

struct qstr {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry {
	struct dentry *d_parent;
	struct qstr d_name;
} __attribute__((preserve_access_index));

struct vfsmount {
	struct dentry *mnt_root;
} __attribute__((preserve_access_index));

struct mount {
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
} __attribute__((preserve_access_index));

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	__u16 i_mode;
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
	struct inode *f_inode;
	unsigned int f_mode;
} __attribute__((preserve_access_index));

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct fs_struct {
	struct path root, pwd;
} __attribute__((preserve_access_index));

struct pid_namespace;

struct upid {
	int nr;
	struct pid_namespace *ns;
} __attribute__((preserve_access_index));

struct pid {
	unsigned int level;
	struct upid numbers[1];
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct fs_struct *fs;
	struct files_struct *files;
	struct pid *thread_pid;
	struct task_struct *group_leader;
} __attribute__((preserve_access_index));

// x86_64 syscall numbers.
#define NR_write 1
#define NR_open 2
#define NR_mmap 9
#define NR_ioctl 16
#define NR_pwrite64 18
#define NR_writev 20
#define NR_sendfile 40
#define NR_truncate 76
#define NR_ftruncate 77
#define NR_rename 82
#define NR_mkdir 83
#define NR_rmdir 84
#define NR_creat 85
#define NR_link 86
#define NR_unlink 87
#define NR_symlink 88
#define NR_chmod 90
#define NR_fchmod 91
#define NR_chown 92
#define NR_fchown 93
#define NR_lchown 94
#define NR_utime 132
#define NR_mknod 133
#define NR_pivot_root 155
#define NR_chroot 161
#define NR_mount 165
#define NR_umount2 166
#define NR_swapon 167
#define NR_setxattr 188
#define NR_lsetxattr 189
#define NR_fsetxattr 190
#define NR_removexattr 197
#define NR_lremovexattr 198
#define NR_fremovexattr 199
#define NR_utimes 235
#define NR_openat 257
#define NR_mkdirat 258
#define NR_mknodat 259
#define NR_fchownat 260
#define NR_futimesat 261
#define NR_unlinkat 263
#define NR_renameat 264
#define NR_linkat 265
#define NR_symlinkat 266
#define NR_fchmodat 268
#define NR_splice 275
#define NR_utimensat 280
#define NR_fallocate 285
#define NR_pwritev 296
#define NR_open_by_handle_at 304
#define NR_renameat2 316
#define NR_copy_file_range 326
#define NR_pwritev2 328
// bind of a unix socket creates a file; ptrace and process_vm_writev
// change another process that need not run. (Signals need no tracing: the
// inspector samples each process's stopped state and pending signals.)
#define NR_bind 49
#define NR_ptrace 101
#define NR_process_vm_writev 311
#define NR_io_uring_setup 425
#define NR_io_uring_enter 426
#define NR_io_uring_register 427
#define NR_open_tree 428
#define NR_move_mount 429
#define NR_fsmount 432
#define NR_openat2 437
#define NR_mount_setattr 442
#define NR_fchmodat2 452
#define NR_setxattrat 463
#define NR_removexattrat 466

#define AT_FDCWD -100
#define O_ACCMODE 3
#define O_CREAT 0100
#define O_TRUNC 01000
#define AF_UNIX 1
#define MAP_SHARED 0x01
#define MAP_SHARED_VALIDATE 0x03
#define FMODE_WRITE 0x2
#define S_IFMT 0170000
#define S_IFREG 0100000
#define S_IFDIR 0040000
#define S_IFIFO 0010000
#define S_IFSOCK 0140000

// Syscall classes; keep in step with bpf/classes.go.
#define CL_UNKNOWN 0
#define CL_PURE 1
#define CL_FILE 2
#define CL_STREAM 3
#define CL_EFFECT 4
#define MAX_SYSCALL 512

// More syscall numbers, of the stream and effect classes the programs
// look at the arguments of.
#define NR_read 0
#define NR_kill 62
#define NR_fcntl 72
#define NR_flock 73
#define NR_rt_sigqueueinfo 129
#define NR_setpriority 141
#define NR_sched_setparam 142
#define NR_sched_setscheduler 144
#define NR_tkill 200
#define NR_sched_setaffinity 203
#define NR_tgkill 234
#define NR_ioprio_set 251
#define NR_migrate_pages 256
#define NR_tee 276
#define NR_move_pages 279
#define NR_rt_tgsigqueueinfo 297
#define NR_prlimit64 302
#define NR_sched_setattr 314
// fcntl commands that change the open file or its locks (the rest read,
// or change only the caller's descriptor table).
#define F_SETFL 4
#define F_SETLK 6
#define F_SETLKW 7
#define F_SETOWN 8
#define F_SETSIG 10
#define F_SETOWN_EX 15
#define F_OFD_SETLK 37
#define F_OFD_SETLKW 38
#define F_SETLEASE 1024
#define F_NOTIFY 1026
#define F_SETPIPE_SZ 1031
#define F_ADD_SEALS 1033
#define F_SET_RW_HINT 1036
#define F_SET_FILE_RW_HINT 1038

// Event types; keep in step with bpf/events.go.
#define EV_SYSCALL 1
#define EV_FORK 2
#define EV_EXEC 3
#define EV_EXIT 4

// Event flags: which path slots hold something and what went wrong.
#define F_PATH0 (1 << 0)    // slot 0: a path string from user memory
#define F_PATH1 (1 << 1)    // slot 1: a kernel-resolved path
#define F_PATH2 (1 << 2)    // slot 2: a second path string from user memory
#define F_PATH3 (1 << 3)    // slot 3: the kernel-resolved base of slot 2
#define F_TRUNC (1 << 4)    // some path did not fit or could not be read
#define F_OUTSIDE1 (1 << 5) // slot 1 is not below the task's root (memfd, pipe, other mount ns)
#define F_OUTSIDE3 (1 << 6)
#define F_FDFILE (1 << 7)   // slot 1 is the file an fd refers to (not a base directory)
#define F_NOFD (1 << 8)     // an fd did not resolve to a file
#define F_STREAM (1 << 9)   // a stream call: mode, ino and dev of the fd's file, no path
#define F_EFFECT (1 << 10)  // an effect call: by number, arg is its first argument

#define SLOT 1024     // bytes per path slot
#define OFFMASK 511   // where a path component may start
#define NAMEMAX 256   // a component with its NUL
#define MAXDEPTH 48   // dentries walked up to the root

struct event {
	__u64 ts;
	__u64 cgid;
	__u32 type;
	__u32 nr;
	__u32 pid;
	__u32 tgid;
	__s64 ret;
	__u64 arg;     // open flags, ioctl cmd, mmap flags, child pid of a fork
	__s32 dirfd[2];
	__u32 flags;
	__u32 mode;    // i_mode of the fd's inode (fd events)
	__u64 ino;
	__u32 dev;
	__u32 _pad;
	char path[4][SLOT];
};

// Keeps struct event in the BTF so that bpf2go emits its Go type.
const struct event *unused_event __attribute__((unused));

struct args {
	__u64 nr;
	__u64 a[6];
};

struct tracked {
	__u64 epoch;   // bumped by user space at each turn: write dedup resets
	__u64 seen[8]; // effect calls reported this epoch, a bit per number
};

struct wkey {
	__u32 tgid;
	__s32 fd;
};

struct wval {
	__u64 file;
	__u64 epoch;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct tracked);
} cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct args);
} inflight SEC(".maps");

// classes holds each syscall's class (CL_*), filled by user space from
// bpf/classes.go; 0 (CL_UNKNOWN) for a number the table lacks.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SYSCALL);
	__type(key, __u32);
	__type(value, __u32);
} classes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct wkey);
	__type(value, struct wval);
} written SEC(".maps");

// returns counts, per process, the syscalls that returned to user mode
// (not counting -ERESTART* returns, which only re-enter the call): user
// space compares it across a turn to tell a process that ran from one that
// slept through it, even when the cgroup was frozen and thawed meanwhile.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} returns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

struct scratch {
	__u64 d[64]; // struct dentry *, leaf first
	char buf[SLOT];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

static __always_inline struct tracked *tracked_cgroup(__u64 *cgid)
{
	*cgid = bpf_get_current_cgroup_id();
	return bpf_map_lookup_elem(&cgroups, cgid);
}

static __always_inline void count_lost(void)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&lost, &k);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline struct event *new_event(__u32 type, __u64 cgid)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost();
		return 0;
	}
	__u64 id = bpf_get_current_pid_tgid();
	e->ts = bpf_ktime_get_ns();
	e->cgid = cgid;
	e->type = type;
	e->nr = 0;
	e->pid = (__u32)id;
	e->tgid = id >> 32;
	e->ret = 0;
	e->arg = 0;
	e->dirfd[0] = 0;
	e->dirfd[1] = 0;
	e->flags = 0;
	e->mode = 0;
	e->ino = 0;
	e->dev = 0;
	e->_pad = 0;
	e->path[0][0] = 0;
	e->path[1][0] = 0;
	e->path[2][0] = 0;
	e->path[3][0] = 0;
	return e;
}

struct walk_ctx {
	struct vfsmount *vm;
	struct dentry *d;
	struct mount *m;
	struct dentry *root_d;
	struct vfsmount *root_m;
	__u32 n;
	__u32 off;
	__u32 flags;
	__u32 outside;
	int done;
};

// walk_up moves one step from a dentry towards the task's root, crossing
// mounts, and records the dentries whose names make the path.
static long walk_up(__u32 i, void *arg)
{
	// Locals, not c->x, inside BPF_CORE_READ: walk_ctx is not a kernel type.
	struct walk_ctx *c = arg;
	struct vfsmount *vm = c->vm;
	struct dentry *d = c->d;
	struct mount *m = c->m;
	if (d == c->root_d && vm == c->root_m) {
		c->done = 1;
		return 1;
	}
	struct dentry *mnt_root = BPF_CORE_READ(vm, mnt_root);
	if (d == mnt_root) {
		struct mount *parent = BPF_CORE_READ(m, mnt_parent);
		if (parent == m) {
			c->flags |= c->outside;
			c->done = 1;
			return 1;
		}
		c->d = BPF_CORE_READ(m, mnt_mountpoint);
		c->m = parent;
		c->vm = (void *)parent + bpf_core_field_offset(struct mount, mnt);
		return 0;
	}
	struct dentry *up = BPF_CORE_READ(d, d_parent);
	if (up == d) {
		c->flags |= c->outside;
		c->done = 1;
		return 1;
	}
	__u32 k = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &k);
	if (!s || c->n >= 64)
		return 1;
	s->d[c->n & 63] = (__u64)d;
	c->n++;
	c->d = up;
	return 0;
}

// put_name appends "/" and the name of the j-th recorded dentry from the
// root down.
static long put_name(__u32 j, void *arg)
{
	struct walk_ctx *c = arg;
	if (j >= c->n)
		return 1;
	if (c->off > OFFMASK - 1) {
		c->flags |= F_TRUNC;
		return 1;
	}
	__u32 k = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &k);
	if (!s)
		return 1;
	struct dentry *d = (struct dentry *)s->d[(c->n - 1 - j) & 63];
	const unsigned char *name = BPF_CORE_READ(d, d_name.name);
	__u32 at = c->off;
	s->buf[at & OFFMASK] = '/';
	at++;
	long l = bpf_probe_read_kernel_str(s->buf + (at & OFFMASK), NAMEMAX, name);
	if (l <= 0) {
		c->flags |= F_TRUNC;
		return 1;
	}
	c->off = at + l - 1;
	return 0;
}

// walk_path writes the path of (mnt, dentry) as seen from the task's root
// into the per-CPU scratch buffer, like d_path. It returns F_TRUNC when the
// path was too deep or too long, and outside when the walk ended at a root
// other than the task's. A global function, so the verifier checks it once
// rather than at every call site; pointers travel as scalars for that.
__noinline __u32 walk_path(__u64 vmp, __u64 dp, __u64 taskp, __u32 outside)
{
	struct vfsmount *vm = (struct vfsmount *)vmp;
	struct task_struct *task = (struct task_struct *)taskp;
	struct walk_ctx c = {
		.vm = vm,
		.d = (struct dentry *)dp,
		.m = (void *)vm - bpf_core_field_offset(struct mount, mnt),
		.root_d = BPF_CORE_READ(task, fs, root.dentry),
		.root_m = BPF_CORE_READ(task, fs, root.mnt),
		.outside = outside,
	};
	bpf_loop(MAXDEPTH, walk_up, &c, 0);
	if (!c.done)
		c.flags |= F_TRUNC;
	__u32 k = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &k);
	if (!s)
		return F_TRUNC;
	if (c.n == 0) {
		s->buf[0] = '/';
		s->buf[1] = 0;
		return c.flags;
	}
	bpf_loop(MAXDEPTH, put_name, &c, 0);
	s->buf[c.off & (SLOT - 1)] = 0;
	return c.flags;
}

// walk runs walk_path and copies the result into out (SLOT bytes).
static __always_inline __u32 walk(struct vfsmount *vm, struct dentry *d, struct task_struct *task, char *out, __u32 outside)
{
	__u32 flags = walk_path((__u64)vm, (__u64)d, (__u64)task, outside);
	__u32 k = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &k);
	if (!s)
		return F_TRUNC;
	bpf_probe_read_kernel(out, SLOT, s->buf);
	return flags;
}

static __always_inline struct file *fd_file(struct task_struct *task, long fd)
{
	if (fd < 0)
		return 0;
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	unsigned int max = BPF_CORE_READ(fdt, max_fds);
	if ((unsigned long)fd >= max)
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	bpf_probe_read_kernel(&f, sizeof(f), fds + fd);
	return f;
}

// put_fd fills slot 1 with the file behind fd and its inode's identity.
static __always_inline void put_fd(struct event *e, struct task_struct *task, struct file *f)
{
	if (!f) {
		e->flags |= F_NOFD;
		return;
	}
	struct inode *ino = BPF_CORE_READ(f, f_inode);
	e->mode = BPF_CORE_READ(ino, i_mode);
	e->ino = BPF_CORE_READ(ino, i_ino);
	e->dev = BPF_CORE_READ(ino, i_sb, s_dev);
	e->flags |= F_PATH1 | F_FDFILE;
	e->flags |= walk(BPF_CORE_READ(f, f_path.mnt), BPF_CORE_READ(f, f_path.dentry), task, e->path[1], F_OUTSIDE1);
}

// put_path fills slot (user string) and slot+1 (its base: the cwd or dirfd's
// directory when the string is relative).
static __always_inline void put_path(struct event *e, struct task_struct *task, int slot, long dirfd, const char *up)
{
	char *s = slot == 0 ? e->path[0] : e->path[2];
	char *b = slot == 0 ? e->path[1] : e->path[3];
	__u32 out = slot == 0 ? F_OUTSIDE1 : F_OUTSIDE3;
	e->dirfd[slot == 0 ? 0 : 1] = (__s32)dirfd;
	if (up) {
		if (bpf_probe_read_user_str(s, SLOT, up) < 0)
			e->flags |= F_TRUNC;
		e->flags |= slot == 0 ? F_PATH0 : F_PATH2;
		if (s[0] == '/')
			return;
	}
	struct vfsmount *vm;
	struct dentry *d;
	if (dirfd == AT_FDCWD) {
		vm = BPF_CORE_READ(task, fs, pwd.mnt);
		d = BPF_CORE_READ(task, fs, pwd.dentry);
	} else {
		struct file *f = fd_file(task, dirfd);
		if (!f) {
			e->flags |= F_NOFD;
			return;
		}
		vm = BPF_CORE_READ(f, f_path.mnt);
		d = BPF_CORE_READ(f, f_path.dentry);
	}
	e->flags |= slot == 0 ? F_PATH1 : F_PATH3;
	e->flags |= walk(vm, d, task, b, out);
}

static __always_inline int interesting(long nr)
{
	switch (nr) {
	case NR_write: case NR_open: case NR_mmap: case NR_ioctl: case NR_pwrite64:
	case NR_writev: case NR_sendfile: case NR_truncate: case NR_ftruncate:
	case NR_rename: case NR_mkdir: case NR_rmdir: case NR_creat: case NR_link:
	case NR_unlink: case NR_symlink: case NR_chmod: case NR_fchmod: case NR_chown:
	case NR_fchown: case NR_lchown: case NR_utime: case NR_mknod: case NR_pivot_root:
	case NR_chroot: case NR_mount: case NR_umount2: case NR_swapon: case NR_setxattr:
	case NR_lsetxattr: case NR_fsetxattr: case NR_removexattr: case NR_lremovexattr:
	case NR_fremovexattr: case NR_utimes: case NR_openat: case NR_mkdirat:
	case NR_mknodat: case NR_fchownat: case NR_futimesat: case NR_unlinkat:
	case NR_renameat: case NR_linkat: case NR_symlinkat: case NR_fchmodat:
	case NR_splice: case NR_utimensat: case NR_fallocate: case NR_pwritev:
	case NR_open_by_handle_at: case NR_renameat2: case NR_copy_file_range:
	case NR_pwritev2: case NR_io_uring_setup: case NR_io_uring_enter:
	case NR_io_uring_register: case NR_open_tree: case NR_move_mount: case NR_fsmount:
	case NR_openat2: case NR_mount_setattr: case NR_fchmodat2: case NR_setxattrat:
	case NR_removexattrat:
	case NR_bind: case NR_ptrace: case NR_process_vm_writev:
		return 1;
	}
	return 0;
}

SEC("raw_tracepoint/sys_enter")
int sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	long nr = ctx->args[1];
	if (!interesting(nr))
		return 0;
	__u64 cgid;
	if (!tracked_cgroup(&cgid))
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	struct args a = {.nr = nr};
	a.a[0] = BPF_CORE_READ(regs, di);
	a.a[1] = BPF_CORE_READ(regs, si);
	a.a[2] = BPF_CORE_READ(regs, dx);
	a.a[3] = BPF_CORE_READ(regs, r10);
	a.a[4] = BPF_CORE_READ(regs, r8);
	a.a[5] = BPF_CORE_READ(regs, r9);
	__u64 id = bpf_get_current_pid_tgid();
	bpf_map_update_elem(&inflight, &id, &a, BPF_ANY);
	return 0;
}

// writes_once reports whether this is the first write through this open
// file by this process since the turn began (the epoch changed).
static __always_inline int writes_once(__u32 tgid, long fd, struct file *f, struct tracked *t)
{
	struct wkey k = {.tgid = tgid, .fd = (__s32)fd};
	struct wval *v = bpf_map_lookup_elem(&written, &k);
	if (v && v->file == (__u64)f && v->epoch == t->epoch)
		return 0;
	struct wval nv = {.file = (__u64)f, .epoch = t->epoch};
	bpf_map_update_elem(&written, &k, &nv, BPF_ANY);
	return 1;
}

static __always_inline int is_reg(struct file *f)
{
	if (!f)
		return 0;
	__u16 mode = BPF_CORE_READ(f, f_inode, i_mode);
	return (mode & S_IFMT) == S_IFREG;
}

// is_stream reports whether f is a pipe, FIFO or socket: what holds data
// queued between processes.
static __always_inline int is_stream(struct file *f)
{
	if (!f)
		return 0;
	__u16 mode = BPF_CORE_READ(f, f_inode, i_mode) & S_IFMT;
	return mode == S_IFIFO || mode == S_IFSOCK;
}

// stream_fd reports a stream call through fd (once per descriptor, open
// file and epoch): the inode of its file, for user space to look for
// among the descriptors of the processes that outlive the turn. any
// reports any file (locks, fcntl), else only pipes, FIFOs and sockets.
static __always_inline int stream_fd(struct tracked *t, __u64 cgid, long nr, long ret, struct task_struct *task, long fd, int any)
{
	struct file *f = fd_file(task, fd);
	if (!f || (!any && !is_stream(f)))
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	// Keyed apart from writes to regular files (the same fd's write
	// event must not hide its lock, nor the other way round).
	if (!writes_once(id >> 32, fd | 0x40000000, f, t))
		return 0;
	struct event *e = new_event(EV_SYSCALL, cgid);
	if (!e)
		return 0;
	struct inode *ino = BPF_CORE_READ(f, f_inode);
	e->nr = nr;
	e->ret = ret;
	e->dirfd[0] = (__s32)fd;
	e->flags = F_STREAM;
	if ((BPF_CORE_READ(ino, i_mode) & S_IFMT) == S_IFIFO) {
		// A named FIFO's times move with its data: its path too (an
		// anonymous pipe's is outside the task's root).
		put_fd(e, task, f);
	} else {
		e->mode = BPF_CORE_READ(ino, i_mode);
		e->ino = BPF_CORE_READ(ino, i_ino);
		e->dev = BPF_CORE_READ(ino, i_sb, s_dev);
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

// stream_call handles a call of the stream class: the descriptor
// arguments it reads or writes through.
static __always_inline int stream_call(struct tracked *t, __u64 cgid, long nr, long ret, struct pt_regs *regs)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	long a0 = (long)(int)BPF_CORE_READ(regs, di);
	switch (nr) {
	case NR_fcntl: {
		long cmd = (long)(int)BPF_CORE_READ(regs, si);
		switch (cmd) {
		case F_SETFL: case F_SETLK: case F_SETLKW: case F_SETOWN: case F_SETSIG:
		case F_SETOWN_EX: case F_OFD_SETLK: case F_OFD_SETLKW: case F_SETLEASE:
		case F_NOTIFY: case F_SETPIPE_SZ: case F_ADD_SEALS: case F_SET_RW_HINT:
		case F_SET_FILE_RW_HINT:
			return stream_fd(t, cgid, nr, ret, task, a0, 1);
		}
		return 0;
	}
	case NR_flock:
		return stream_fd(t, cgid, nr, ret, task, a0, 1);
	case NR_tee:
		stream_fd(t, cgid, nr, ret, task, a0, 0);
		return stream_fd(t, cgid, nr, ret, task, (long)(int)BPF_CORE_READ(regs, si), 0);
	}
	return stream_fd(t, cgid, nr, ret, task, a0, 0);
}

// ns_nr is task's pid in its own (innermost) pid namespace: what the
// task's calls name it by.
static __always_inline int ns_nr(struct task_struct *task)
{
	struct pid *p = BPF_CORE_READ(task, thread_pid);
	if (!p)
		return -1;
	unsigned int level = BPF_CORE_READ(p, level);
	int nr = -1;
	void *at = (void *)p + bpf_core_field_offset(struct pid, numbers) +
		(__u64)(level & 63) * bpf_core_type_size(struct upid) + bpf_core_field_offset(struct upid, nr);
	bpf_probe_read_kernel(&nr, sizeof(nr), at);
	return nr;
}

// self reports whether pid names the calling task or its process, by the
// host's numbers or by the sandbox's (0 is the caller for every call that
// takes a pid).
static __always_inline int self(__u64 pid)
{
	__u64 id = bpf_get_current_pid_tgid();
	int p = (int)pid;
	if (p == 0 || p == (int)(__u32)id || p == (int)(id >> 32))
		return 1;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	return p == ns_nr(task) || p == ns_nr(BPF_CORE_READ(task, group_leader));
}

// effect_call reports a call of the effect class, once per number and
// epoch, unless it is aimed at the caller itself (its own scheduling,
// limits, signals), which dies with it or shows in its probes.
static __always_inline int effect_call(struct tracked *t, __u64 cgid, long nr, long ret, struct pt_regs *regs)
{
	__u64 a0 = BPF_CORE_READ(regs, di);
	__u64 a1 = BPF_CORE_READ(regs, si);
	__u64 a2 = BPF_CORE_READ(regs, dx);
	switch (nr) {
	case NR_kill:
		if ((int)a1 == 0 || self(a0))
			return 0; // a probe, or to itself
		break;
	case NR_tkill: case NR_tgkill: case NR_rt_sigqueueinfo: case NR_rt_tgsigqueueinfo:
	case NR_sched_setparam: case NR_sched_setscheduler: case NR_sched_setaffinity:
	case NR_sched_setattr: case NR_migrate_pages: case NR_move_pages:
		if (self(a0))
			return 0;
		break;
	case NR_setpriority:
		if ((int)a0 == 0 && self(a1)) // PRIO_PROCESS
			return 0;
		break;
	case NR_ioprio_set:
		if ((int)a0 == 1 && self(a1)) // IOPRIO_WHO_PROCESS
			return 0;
		break;
	case NR_prlimit64:
		if (a2 == 0 || self(a0))
			return 0; // a read, or its own limits
		break;
	}
	__u64 bit = 1ULL << (nr & 63);
	__u64 *w = &t->seen[(nr >> 6) & 7];
	if (*w & bit)
		return 0;
	__sync_fetch_and_or(w, bit);
	struct event *e = new_event(EV_SYSCALL, cgid);
	if (!e)
		return 0;
	e->nr = nr;
	e->ret = ret;
	e->arg = a0;
	e->flags = F_EFFECT;
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("raw_tracepoint/sys_exit")
int sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 cgid;
	struct tracked *t = tracked_cgroup(&cgid);
	if (!t)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	long ret = ctx->args[1];
	if (ret < -516 || ret > -512) {
		__u32 tgid = id >> 32;
		__u64 *n = bpf_map_lookup_elem(&returns, &tgid);
		if (n) {
			__sync_fetch_and_add(n, 1);
		} else {
			__u64 one = 1;
			bpf_map_update_elem(&returns, &tgid, &one, BPF_NOEXIST);
		}
	}
	// Stream and effect calls are told by their class and read their
	// arguments from the registers, which hold them still at exit.
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	long cnr = BPF_CORE_READ(regs, orig_ax);
	if (cnr >= 0 && cnr < MAX_SYSCALL) {
		__u32 k = cnr;
		__u32 *cl = bpf_map_lookup_elem(&classes, &k);
		__u32 c = cl ? *cl : CL_UNKNOWN;
		if (c == CL_PURE)
			return 0;
		if (c != CL_FILE) {
			if (ret < 0)
				return 0; // a failed call changed nothing
			if (c == CL_STREAM)
				return stream_call(t, cgid, cnr, ret, regs);
			return effect_call(t, cgid, cnr, ret, regs);
		}
	}
	struct args *ap = bpf_map_lookup_elem(&inflight, &id);
	if (!ap)
		return 0;
	struct args a = *ap;
	bpf_map_delete_elem(&inflight, &id);
	if (ret < 0)
		return 0; // a failed call changed nothing
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	long nr = a.nr;
	struct file *f = 0;
	long fd = -1;
	__u64 arg = 0;

	// First the fd-based calls, which may need no event at all.
	switch (nr) {
	case NR_write: case NR_pwrite64: case NR_writev: case NR_pwritev: case NR_pwritev2:
		fd = a.a[0];
		f = fd_file(task, fd);
		if (is_stream(f))
			return stream_fd(t, cgid, nr, ret, task, fd, 0);
		if (!is_reg(f) || !writes_once(id >> 32, fd, f, t))
			return 0;
		break;
	case NR_ftruncate: case NR_fallocate: case NR_fchmod: case NR_fchown:
	case NR_fsetxattr: case NR_fremovexattr: case NR_sendfile:
		fd = a.a[0];
		f = fd_file(task, fd);
		if (nr == NR_sendfile && !is_reg(f))
			return stream_fd(t, cgid, nr, ret, task, fd, 0);
		break;
	case NR_copy_file_range: case NR_splice:
		if (nr == NR_splice)
			stream_fd(t, cgid, nr, ret, task, (long)(int)a.a[0], 0);
		fd = a.a[2];
		f = fd_file(task, fd);
		if (!is_reg(f))
			return nr == NR_splice ? stream_fd(t, cgid, nr, ret, task, fd, 0) : 0;
		break;
	case NR_ioctl: {
		fd = a.a[0];
		f = fd_file(task, fd);
		if (!f)
			return 0;
		__u16 mode = BPF_CORE_READ(f, f_inode, i_mode);
		if ((mode & S_IFMT) != S_IFREG && (mode & S_IFMT) != S_IFDIR)
			return 0;
		arg = a.a[1];
		break;
	}
	case NR_mmap: {
		if (!(a.a[3] & MAP_SHARED))
			return 0; // private mappings never write back
		fd = (long)(int)a.a[4];
		f = fd_file(task, fd);
		if (!is_reg(f))
			return 0;
		if (!(BPF_CORE_READ(f, f_mode) & FMODE_WRITE))
			return 0; // cannot become writable
		arg = a.a[2];
		break;
	}
	// bind of a unix socket to a path creates a file there.
	case NR_bind: {
		__u16 family = 0;
		char first = 0;
		bpf_probe_read_user(&family, sizeof(family), (void *)a.a[1]);
		bpf_probe_read_user(&first, sizeof(first), (void *)(a.a[1] + 2));
		if (family != AF_UNIX || first == 0)
			return 0; // another family, an abstract or unnamed socket
		break;
	}
	case NR_open: case NR_creat: case NR_openat: case NR_openat2: case NR_open_by_handle_at: {
		__u64 fl = 0;
		if (nr == NR_open)
			fl = a.a[1];
		else if (nr == NR_creat)
			fl = O_CREAT | O_TRUNC | 1;
		else if (nr == NR_openat || nr == NR_open_by_handle_at)
			fl = a.a[2];
		else
			bpf_probe_read_user(&fl, sizeof(fl), (void *)a.a[2]);
		if (!(fl & (O_ACCMODE | O_CREAT | O_TRUNC)))
			return 0; // read-only open
		fd = ret;
		f = fd_file(task, fd);
		arg = fl;
		break;
	}
	}

	struct event *e = new_event(EV_SYSCALL, cgid);
	if (!e)
		return 0;
	e->nr = nr;
	e->ret = ret;
	e->arg = arg;
	switch (nr) {
	case NR_write: case NR_pwrite64: case NR_writev: case NR_pwritev: case NR_pwritev2:
	case NR_ftruncate: case NR_fallocate: case NR_fchmod: case NR_fchown:
	case NR_fsetxattr: case NR_fremovexattr: case NR_sendfile:
	case NR_copy_file_range: case NR_splice: case NR_ioctl: case NR_mmap:
	case NR_open: case NR_creat: case NR_openat: case NR_openat2: case NR_open_by_handle_at:
		e->dirfd[0] = (__s32)fd;
		put_fd(e, task, f);
		break;
	// One path, relative to the cwd.
	case NR_truncate: case NR_unlink: case NR_mkdir: case NR_rmdir: case NR_chmod:
	case NR_chown: case NR_lchown: case NR_setxattr: case NR_lsetxattr:
	case NR_removexattr: case NR_lremovexattr: case NR_utime: case NR_utimes: case NR_mknod:
		put_path(e, task, 0, AT_FDCWD, (const char *)a.a[0]);
		break;
	// One path relative to a dirfd; a NULL path means the dirfd's file.
	case NR_unlinkat: case NR_mkdirat: case NR_mknodat: case NR_fchownat:
	case NR_fchmodat: case NR_fchmodat2: case NR_futimesat: case NR_utimensat:
	case NR_setxattrat: case NR_removexattrat:
		put_path(e, task, 0, (long)(int)a.a[0], (const char *)a.a[1]);
		break;
	case NR_rename: case NR_link:
		put_path(e, task, 0, AT_FDCWD, (const char *)a.a[0]);
		put_path(e, task, 1, AT_FDCWD, (const char *)a.a[1]);
		break;
	case NR_renameat: case NR_renameat2: case NR_linkat:
		put_path(e, task, 0, (long)(int)a.a[0], (const char *)a.a[1]);
		put_path(e, task, 1, (long)(int)a.a[2], (const char *)a.a[3]);
		break;
	case NR_symlink:
		put_path(e, task, 1, AT_FDCWD, (const char *)a.a[1]);
		break;
	case NR_symlinkat:
		put_path(e, task, 1, (long)(int)a.a[1], (const char *)a.a[2]);
		break;
	case NR_bind: // sockaddr_un: sun_family, then sun_path
		put_path(e, task, 0, AT_FDCWD, (const char *)(a.a[1] + 2));
		break;
	default:
		// ptrace, process_vm_writev: by number.
		// io_uring, mounts, chroot, swapon: reported by number only.
		break;
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

struct fork_args {
	__u64 parent; // struct task_struct *
	__u64 child;
};

SEC("raw_tracepoint/sched_process_fork")
int process_fork(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 cgid;
	if (!tracked_cgroup(&cgid))
		return 0;
	struct task_struct *child = (struct task_struct *)ctx->args[1];
	int pid = BPF_CORE_READ(child, pid);
	int tgid = BPF_CORE_READ(child, tgid);
	if (pid != tgid)
		return 0; // a new thread, not a new process
	struct event *e = new_event(EV_FORK, cgid);
	if (!e)
		return 0;
	e->arg = (__u32)tgid;
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int process_exec(void *ctx)
{
	__u64 cgid;
	if (!tracked_cgroup(&cgid))
		return 0;
	struct event *e = new_event(EV_EXEC, cgid);
	if (!e)
		return 0;
	bpf_get_current_comm(e->path[0], 16);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int process_exit(void *ctx)
{
	// A task that dies inside a syscall never reaches sys_exit: forget its
	// arguments so that a later task with the same id does not find them.
	__u64 id = bpf_get_current_pid_tgid();
	bpf_map_delete_elem(&inflight, &id);
	__u64 cgid;
	if (!tracked_cgroup(&cgid))
		return 0;
	if ((__u32)id != id >> 32)
		return 0; // a thread, not the process
	__u32 tgid = id >> 32;
	bpf_map_delete_elem(&returns, &tgid);
	struct event *e = new_event(EV_EXIT, cgid);
	if (!e)
		return 0;
	bpf_get_current_comm(e->path[0], 16);
	bpf_ringbuf_submit(e, 0);
	return 0;
}
