package imgcompare

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
)

// A rule normalises a field that differs between two dumps of equal
// trees. It applies to the fields of images of magic (any when "", or
// one of several separated by spaces) whose
// path within the entry (".tc.flags", ".reg.mnt_id") matches field, and
// of entries for which when (if set) holds; do returns the value to
// compare, or false to leave the field out.
type rule struct {
	magic string
	file  string // only in this image file, when set
	field *regexp.Regexp
	when  func(entry map[string]string) bool
	// heap: only the field of a heap mapping (CRIU's VMA_AREA_HEAP).
	heap bool
	do   func(rn *renumbers, path, val string) (string, bool)
}

func (r rule) matches(magic string) bool {
	return r.magic == "" || slices.Contains(strings.Fields(r.magic), magic)
}

func dropIt(*renumbers, string, string) (string, bool) { return "", false }

// renumber compares numbers that name a kernel object (an inode, a mount)
// by their order of first appearance in the set, within class: which
// entries share one (a pipe's two ends, a socket and its peer) still
// compares, the numbers themselves do not.
func renumber(class string) func(*renumbers, string, string) (string, bool) {
	return func(rn *renumbers, _, val string) (string, bool) { return rn.of(class, val), true }
}

// clearBits compares a number without bits.
func clearBits(bits uint64) func(*renumbers, string, string) (string, bool) {
	return func(_ *renumbers, _, val string) (string, bool) {
		n, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return val, true
		}
		return strconv.FormatUint(n&^bits, 10), true
	}
}

// armed compares a timer's current value by whether it runs: the time
// left is a time.
func armed(_ *renumbers, _, val string) (string, bool) {
	if val == "0" {
		return "0", true
	}
	return "armed", true
}

const (
	pfForkNoExec = 0x40  // PF_FORKNOEXEC
	pfSuperPriv  = 0x100 // PF_SUPERPRIV
	oLargeFile   = 0o100000
)

var subvolID = regexp.MustCompile(`subvolid=[0-9]+`)

// rules are the normalisations: as few as two dumps of equal trees (a
// live env and its exact branch, TestCRIUOracle) need, each with why
// the field differs by design.
var rules = []rule{
	// Init's memory map: init is Arbor's Go program, whose runtime maps
	// memory as it serves commands (the turn's, the probe's), and a skip
	// restores its image of an earlier turn by design. Its descriptors,
	// signals, limits and creds are compared as every process's.
	{magic: "MM", file: "mm-1.img", field: regexp.MustCompile(``), do: dropIt},
	// A task's heap extent: its allocator's, grown as the shell runs
	// commands (the turn's, the probe's), and a skip or a shell delta
	// restores an earlier image of the task by design; what the heap
	// holds is memory, which is not compared either. Where the heap
	// starts, and every other mapping, is compared.
	{magic: "MM", field: regexp.MustCompile(`^\.mm_brk$`), do: dropIt},
	{magic: "MM", field: regexp.MustCompile(`^\.vmas\[[0-9]+\]\.end$`), do: dropIt, heap: true},
	// File ids: CRIU numbers files in the order it walks the tree
	// (fileLabels); a file is compared by what it is, wherever it is
	// named.
	{magic: "FILES FDINFO FS MM REMAP_FPATH", field: regexp.MustCompile(`^(\.id|\.[a-z]+\.id|\.cwd_id|\.root_id|\.exe_file_id|\.orig_id|\.regf_id|\.vmas.*\.shmid)$`), do: fileRef},
	// A task's other objects (its descriptor table, fs, memory, signal
	// handlers) and seccomp filters, numbered in the same walk: which
	// tasks share one still compares.
	{magic: "IDS", field: regexp.MustCompile(`^\.(files|fs|vm|sighand)_id$`), do: renumber("task-objects")},
	{magic: "CORE", field: regexp.MustCompile(`^\.thread_core\.seccomp_filter$`), do: renumber("seccomp")},
	// CRIU restores a descriptor of a removed file through a link it
	// names NAME.cr_link (docs/inspector.md, "What a restore brings
	// back"; the probe reads it as NAME too).
	{magic: "FILES", field: regexp.MustCompile(`^\.reg\.name$`), do: func(_ *renumbers, _, val string) (string, bool) {
		return strings.TrimSuffix(val, ".cr_link"), true
	}},
	// Registers: where each thread was stopped. Init's Go runtime
	// threads poll and spin, and a skip restores the process image of an
	// earlier turn by design; what a skip must keep is not the CPU's
	// context (the probe reads the state it makes observable).
	{magic: "CORE", field: regexp.MustCompile(`^\.thread_info\.(gpregs|fpregs)\.`), do: dropIt},
	// Accounting flags the kernel sets as a task runs: CRIU forks every
	// task it restores and execs none (PF_FORKNOEXEC), and whether a
	// task has used a privilege (PF_SUPERPRIV) depends on its history.
	{magic: "CORE", field: regexp.MustCompile(`^\.tc\.flags$`), do: clearBits(pfForkNoExec | pfSuperPriv)},
	// A timer's time left is a time; whether it runs, its interval and
	// its signal are state.
	{magic: "CORE", field: regexp.MustCompile(`^\.tc\.timers\.(real|virt|prof)\.v(sec|usec)$`), do: armed},
	{magic: "CORE", field: regexp.MustCompile(`^\.tc\.timers\.posix.*\.v(sec|nsec)$`), do: armed},
	// Inode numbers of pipes and sockets: a restore makes new ones.
	{field: regexp.MustCompile(`^\.(pipe\.pipe_id|pipe_id|usk\.ino|usk\.peer|ino|peer|epfd\.tfd.*\.inode|fifo\.pipe_id)$`), do: renumber("inode")},
	// Mount ids and device numbers: the restored tree has new mounts
	// (its root a new clone of the file system, a new devpts).
	{field: regexp.MustCompile(`^\.(reg\.mnt_id|mnt_id|parent_mnt_id|ext\.mnt_id)$`), do: renumber("mnt")},
	// (Device numbers by image type: which of them come first differs
	// with the mounts a tree holds files on.)
	{magic: "MNTS", field: regexp.MustCompile(`^\.root_dev$`), do: renumber("mnt-dev")},
	{magic: "TTY_INFO", field: regexp.MustCompile(`^\.dev$`), do: renumber("tty-dev")},
	{magic: "GHOST_FILE", field: regexp.MustCompile(`^\.dev$`), do: renumber("ghost-dev")},
	{magic: "FILES", field: regexp.MustCompile(`^\.epfd\.tfd.*\.dev$`), do: renumber("epoll-dev")},
	// (With the core images of its threads, initThreads.)
	{magic: "PSTREE", field: regexp.MustCompile(`^\.threads`), when: func(e map[string]string) bool { return e[".pid"] == "1" }, do: dropIt},
	// A removed directory's mtime: CRIU makes it anew at a restore
	// (docs/inspector.md, "What a restore brings back": directory
	// mtimes are a documented gap, which the probe leaves out too).
	{magic: "GHOST_FILE", field: regexp.MustCompile(`^\.mtim\.`), when: func(e map[string]string) bool {
		mode, err := strconv.ParseUint(e[".mode"], 10, 32)
		return err == nil && mode&0o170000 == 0o040000
	}, do: dropIt},
	// A removed file's access time: CRIU reads the file to copy it into
	// the image (the probe reads no atime either).
	{magic: "GHOST_FILE", field: regexp.MustCompile(`^\.atim\.`), do: dropIt},
	// The clone is a new btrfs subvolume.
	{magic: "MNTS", field: regexp.MustCompile(`^\.options$`), do: func(_ *renumbers, _, val string) (string, bool) {
		return subvolID.ReplaceAllString(val, "subvolid=<n>"), true
	}},
	// CRIU numbers the namespaces it meets in order, and a restored
	// tree has one more: CRIU restores it into a new time namespace
	// (below).
	{magic: "IDS", field: regexp.MustCompile(`_ns_id$`), do: renumber("ns")},
	// The inventory's root ids are the namespaces of the CRIU that
	// dumped (they tell which of the tree's are the host's), and a live
	// sandbox shares the host's time namespace where a restored one has
	// its own.
	{magic: "INVENTORY", field: regexp.MustCompile(`^\.root_ids\.`), do: dropIt},
	// That namespace's offsets keep the restored clocks going: the
	// image holds the clocks' values at the dump.
	{magic: "TIMENS", field: regexp.MustCompile(``), do: dropIt},
	// CRIU opens the terminal it restores with O_LARGEFILE, which no
	// program observes on x86_64 (the probe leaves it out too).
	{magic: "FILES", field: regexp.MustCompile(`^\.(tty|reg)\.flags$`),
		when: func(e map[string]string) bool {
			return e[".type"] == "TTY" || strings.HasPrefix(e[".reg.name"], "/dev/pts/")
		},
		do: clearBits(oLargeFile)},
	// CRIU 4 copies a termios' 19 one-byte control characters into the
	// first 19 bytes of an array of 19 32-bit numbers (tty.c,
	// termios_copy): words 0-3 and three bytes of word 4 hold them, the
	// rest is uninitialised memory.
	{magic: "TTY_INFO", field: regexp.MustCompile(`\.c_cc\[([5-9]|1[0-8])\]$`), do: dropIt},
	{magic: "TTY_INFO", field: regexp.MustCompile(`\.c_cc\[4\]$`), do: clearBits(0xff000000)},
}

// ruleFor reports whether a rule changes path in images of magic (for
// what a file is, which leaves out what the rules change).
func ruleFor(magic, path string) bool {
	for _, r := range rules {
		if r.matches(magic) && r.file == "" && r.when == nil && !r.heap && r.field.MatchString(path) {
			return true
		}
	}
	return false
}

func apply(rn *renumbers, file, magic, path, val string, entry map[string]string) (string, bool) {
	for _, r := range rules {
		if r.heap && !isHeap(path, entry) {
			continue
		}
		if r.matches(magic) && (r.file == "" || r.file == file) && r.field.MatchString(path) && (r.when == nil || r.when(entry)) {
			return r.do(rn, path, val)
		}
	}
	return val, true
}

// renumbers maps numbers to their order of first appearance in one set,
// per class, and file ids to their labels (fileLabels).
type renumbers struct {
	seen   map[string]map[string]int
	files  map[string]string // file id -> label
	fdinfo map[string]string // files id -> pid
}

// fileLabel is the label of a files.img entry.
func (r *renumbers) fileLabel(e proto.Message) string {
	m := e.ProtoReflect()
	if fd := m.Descriptor().Fields().ByName("id"); fd != nil && m.Has(fd) {
		if l, ok := r.files[fmt.Sprint(m.Get(fd).Interface())]; ok {
			return l
		}
	}
	return "?"
}

// fileRef compares a file id by the file's label.
func fileRef(rn *renumbers, _, val string) (string, bool) {
	if l, ok := rn.files[val]; ok {
		return l, true
	}
	return val, true
}

func newRenumber() *renumbers { return &renumbers{seen: map[string]map[string]int{}} }

func (r *renumbers) of(class, val string) string {
	m := r.seen[class]
	if m == nil {
		m = map[string]int{}
		r.seen[class] = m
	}
	n, ok := m[val]
	if !ok {
		n = len(m) + 1
		m[val] = n
	}
	return fmt.Sprintf("#%d", n)
}

// nsFile matches the images named by a namespace's id.
var nsFile = regexp.MustCompile(`^(mountpoints|timens|utsns|ipcns-var|ipcns-shm|ipcns-msg|ipcns-sem|netns|userns)-([0-9]+)\.img$`)

// fileName is the name an image is compared under: one named by a
// namespace id (mountpoints-13.img) by the id's number in the set.
func (r *renumbers) fileName(name string) string {
	var id int
	if _, err := fmt.Sscanf(name, "fdinfo-%d.img", &id); err == nil {
		if pid, ok := r.fdinfo[fmt.Sprint(id)]; ok {
			return "fdinfo-of-pid-" + pid + ".img"
		}
	}
	m := nsFile.FindStringSubmatch(name)
	if m == nil {
		return name
	}
	return m[1] + "-" + r.of("ns-file", m[2]) + ".img"
}

func lastField(path string) string {
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[i+1:]
	}
	return path
}

const vmaAreaHeap = 1 << 5 // CRIU's VMA_AREA_HEAP

// isHeap reports whether path is a field of a heap mapping of entry.
func isHeap(path string, entry map[string]string) bool {
	i := strings.LastIndexByte(path, '.')
	if i < 0 {
		return false
	}
	st, err := strconv.ParseUint(entry[path[:i]+".status"], 10, 32)
	return err == nil && st&vmaAreaHeap != 0
}
