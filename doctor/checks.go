package doctor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/arbor-env/arbor/internal/criubin"
)

// TracefsDir is where the checks expect (and mount) tracefs.
const TracefsDir = "/sys/kernel/tracing"

const remedyDeps = "run make deps"

// CheckRoot requires an effective uid of 0: namespaces, mounts, CRIU and
// bpf() all need it.
func CheckRoot(h Host) Check {
	c := Check{Name: "root", Required: true}
	if uid := h.Euid(); uid != 0 {
		return fail(c, fmt.Sprintf("running as uid %d", uid), "run arbor as root (sudo)")
	}
	return ok(c, "euid 0")
}

// CheckCRIU resolves the CRIU binary (flag > private > PATH), requires
// version >= 4.0, runs `criu check` and dumps a throwaway process. It
// returns the binary it judged, empty when none was found.
func CheckCRIU(ctx context.Context, h Host, flag string) (string, []Check) {
	c := Check{Name: "criu", Required: true}
	executable := func(p string) bool {
		fi, err := h.Stat(p)
		return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
	}
	path, err := criubin.Resolve(flag, executable, h.LookPath)
	if err != nil {
		return "", []Check{fail(c, err.Error(), remedyDeps+" (private CRIU 4.x in /opt/arbor/criu) or pass --criu PATH")}
	}
	out, err := h.Run(ctx, nil, path, "--version")
	major, minor, perr := criubin.ParseVersion(string(out))
	if err != nil || perr != nil {
		return path, []Check{fail(c, fmt.Sprintf("%s --version: %s", path, firstLine(out, err)), remedyDeps+" or pass --criu PATH")}
	}
	if major < criubin.MinMajor || major == criubin.MinMajor && minor < criubin.MinMinor {
		return path, []Check{fail(c, fmt.Sprintf("%s is %d.%d; this kernel needs >= %d.%d", path, major, minor, criubin.MinMajor, criubin.MinMinor),
			remedyDeps+" (installs CRIU >= 4.2 from Debian sid privately) or pass --criu PATH")}
	}
	checks := []Check{ok(c, fmt.Sprintf("%s (%d.%d)", path, major, minor))}
	checks = append(checks, checkCRIUCheck(ctx, h, path), checkCRIUDump(ctx, h, path))
	return path, checks
}

func checkCRIUCheck(ctx context.Context, h Host, path string) Check {
	c := Check{Name: "criu check", Required: true}
	out, err := h.Run(ctx, nil, path, "check")
	s := string(out)
	if err == nil && strings.Contains(s, "Looks good") {
		return ok(c, "Looks good")
	}
	detail := "failed"
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "Error") {
			detail = strings.TrimSpace(l)
			break
		}
	}
	if err != nil && detail == "failed" {
		detail = firstLine(out, err)
	}
	return fail(c, detail, "see `"+path+" check`; CRIU needs a kernel built with CONFIG_CHECKPOINT_RESTORE")
}

func checkCRIUDump(ctx context.Context, h Host, path string) Check {
	c := Check{Name: "criu dump", Required: true}
	d, err := h.CRIUDump(ctx, path, nil)
	if err == nil {
		return ok(c, fmt.Sprintf("dumped a sleeping process in %d ms", d.Milliseconds()))
	}
	if errors.Is(err, ErrTimeout) {
		if _, err2 := h.CRIUDump(ctx, path, []string{"CRIU_FAULT=130"}); err2 == nil {
			return fail(c, "dump hangs: hardware breakpoints do not fire on this host; works with CRIU_FAULT=130",
				"export CRIU_FAULT=130 for criu (the make deps wrapper does) or use "+criubin.Private)
		}
	}
	return fail(c, err.Error(), "run the dump by hand with -v4 to see where it stops")
}

// CheckBtrfs requires mkfs.btrfs and btrfs in /proc/filesystems, unless
// the backend is zfs (then it only warns).
func CheckBtrfs(h Host, o Options) Check {
	c := Check{Name: "btrfs", Required: o.Backend != "zfs"}
	mkfs, err := h.LookPath("mkfs.btrfs")
	if err != nil {
		return fail(c, "mkfs.btrfs not found", remedyDeps+" (btrfs-progs)")
	}
	fsList, err := h.ReadFile("/proc/filesystems")
	if err != nil {
		return fail(c, fmt.Sprintf("read /proc/filesystems: %v", err), "")
	}
	if !HasFilesystem(string(fsList), "btrfs") {
		return fail(c, "kernel lacks btrfs", "load the btrfs module (modprobe btrfs) or use --backend zfs")
	}
	return ok(c, mkfs+", kernel support")
}

// HasFilesystem reports whether /proc/filesystems content lists fstype.
func HasFilesystem(procFilesystems, fstype string) bool {
	for _, l := range strings.Split(procFilesystems, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[len(f)-1] == fstype {
			return true
		}
	}
	return false
}

// CheckZFS reports the ZFS tools and which ZFS serves them: the OpenZFS
// kernel module, or zfs-fuse. Optional unless o.Backend is "zfs"; then it
// also says what arbor serve will do: use ARBOR_ZFS_DATASET as is or make
// its own pool file in the state dir, start zfs-fuse when its daemon is not
// running (which needs /dev/fuse), and wire its compatibility shim when
// `zfs list` lacks -p (zfs-fuse).
func CheckZFS(ctx context.Context, h Host, o Options) Check {
	c := Check{Name: "zfs", Required: o.Backend == "zfs"}
	zfs, err1 := h.LookPath("zfs")
	_, err2 := h.LookPath("zpool")
	if err1 != nil || err2 != nil {
		return fail(c, "zfs/zpool not found", remedyDeps+" (zfs-fuse) for --backend zfs")
	}
	pool := "own pool file in " + filepath.Join(o.StateDir, "zfs")
	if o.ZFSDataset != "" {
		pool = "dataset " + o.ZFSDataset + " (ARBOR_ZFS_DATASET)"
	}
	if _, err := h.Stat("/sys/module/zfs"); err == nil {
		if c.Required {
			return ok(c, zfs+", OpenZFS kernel module; "+pool)
		}
		return ok(c, zfs+", OpenZFS kernel module")
	}
	if _, err := h.LookPath("zfs-fuse"); err != nil {
		return fail(c, zfs+" but neither the zfs kernel module nor zfs-fuse", "install OpenZFS or zfs-fuse")
	}
	daemon := "daemon running"
	if !h.ProcessRunning("zfs-fuse") {
		if !c.Required {
			return warn(c, zfs+" (zfs-fuse), daemon not running", "start it: zfs-fuse, or service zfs-fuse start; arbor serve --backend zfs starts it itself")
		}
		if _, err := h.Stat("/dev/fuse"); err != nil {
			return fail(c, zfs+" (zfs-fuse), daemon not running and no /dev/fuse to start it", "modprobe fuse")
		}
		daemon = "daemon not running: arbor serve starts it"
	}
	if !c.Required {
		return ok(c, zfs+" (zfs-fuse, userspace), "+daemon)
	}
	shim := ""
	if out, _ := h.Run(ctx, nil, zfs, "list", "-Hp", "-o", "name"); strings.Contains(string(out), "invalid option") {
		shim = "; zfs list lacks -p: arbor serve wires its compatibility shim"
	}
	return ok(c, zfs+" (zfs-fuse, userspace), "+daemon+shim+"; "+pool)
}

// CheckTracefs requires tracefs at TracefsDir, mounting it when missing;
// tracepoint attachment reads event ids from it.
func CheckTracefs(h Host) Check {
	c := Check{Name: "tracefs", Required: true}
	mi, err := h.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fail(c, fmt.Sprintf("read mountinfo: %v", err), "")
	}
	if m, found := findMount(ParseMountinfo(string(mi)), TracefsDir); found && m.FSType == "tracefs" {
		return ok(c, "mounted at "+TracefsDir)
	}
	if err := h.MountTracefs(); err != nil {
		return fail(c, fmt.Sprintf("mount tracefs: %v", err), "mount -t tracefs tracefs "+TracefsDir)
	}
	return ok(c, "mounted at "+TracefsDir+" (by this check)")
}

// CheckBPF requires loading a program and attaching it to a syscall
// tracepoint, which the inspector does for every sandbox.
func CheckBPF(h Host, tracefsOK bool) Check {
	c := Check{Name: "bpf", Required: true}
	if err := h.BPFTracepoint("syscalls", "sys_exit_openat"); err != nil {
		remedy := "a kernel with CONFIG_BPF_SYSCALL and CONFIG_FTRACE_SYSCALLS"
		if !tracefsOK {
			remedy = "mount tracefs at " + TracefsDir
		}
		return fail(c, err.Error(), remedy)
	}
	return ok(c, "program loaded, attached to tracepoint syscalls/sys_exit_openat")
}

// CgroupV2Dir picks the cgroup v2 mount: /sys/fs/cgroup on a pure v2 host,
// /sys/fs/cgroup/unified on a hybrid one, else any cgroup2 mount.
func CgroupV2Dir(mounts []Mount) (string, bool) {
	var any string
	for _, want := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if m, found := findMount(mounts, want); found && m.FSType == "cgroup2" {
			return want, true
		}
	}
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			any = m.Point
			break
		}
	}
	return any, any != ""
}

// CheckCgroupV2 requires a cgroup v2 tree whose children offer
// cgroup.freeze (eBPF filters by v2 cgroup id; freeze and kill use it).
func CheckCgroupV2(h Host, mountinfo string) Check {
	c := Check{Name: "cgroup v2", Required: true}
	dir, found := CgroupV2Dir(ParseMountinfo(mountinfo))
	if !found {
		return fail(c, "no cgroup2 mount", "mount -t cgroup2 none /sys/fs/cgroup/unified")
	}
	has, err := h.CgroupChildHas(dir, "cgroup.freeze")
	if err != nil {
		return fail(c, fmt.Sprintf("%s: %v", dir, err), "check that "+dir+" is writable by root")
	}
	if !has {
		return fail(c, dir+": child cgroups lack cgroup.freeze", "a kernel >= 5.2")
	}
	return ok(c, dir+", cgroup.freeze in children")
}

// RequiredControllers are the controllers a sandbox's limits use.
var RequiredControllers = []string{"memory", "pids", "cpu"}

// MissingControllers lists the RequiredControllers that neither a v1
// hierarchy nor, on a pure v2 host, the v2 root (v2Controllers, the
// content of its cgroup.controllers) provides.
func MissingControllers(mounts []Mount, v2Controllers string) []string {
	have := map[string]bool{}
	for _, m := range mounts {
		if m.FSType == "cgroup" {
			for _, o := range strings.Split(m.SuperOpts, ",") {
				have[o] = true
			}
		}
	}
	for _, f := range strings.Fields(v2Controllers) {
		have[f] = true
	}
	var miss []string
	for _, c := range RequiredControllers {
		if !have[c] {
			miss = append(miss, c)
		}
	}
	return miss
}

// CheckCgroupControllers requires memory, pids and cpu controllers: v1
// hierarchies on a hybrid host, the v2 root's on a pure v2 host.
func CheckCgroupControllers(h Host, mountinfo string) Check {
	c := Check{Name: "cgroup controllers", Required: true}
	mounts := ParseMountinfo(mountinfo)
	var v2 string
	mode := "v1"
	if m, found := findMount(mounts, "/sys/fs/cgroup"); found && m.FSType == "cgroup2" {
		b, err := h.ReadFile("/sys/fs/cgroup/cgroup.controllers")
		if err != nil {
			return fail(c, fmt.Sprintf("read cgroup.controllers: %v", err), "")
		}
		v2, mode = string(b), "v2"
	}
	if miss := MissingControllers(mounts, v2); len(miss) > 0 {
		return fail(c, "missing "+strings.Join(miss, ", "), "enable them (cgroup_enable= on the kernel command line) or mount their v1 hierarchies")
	}
	return ok(c, mode+": "+strings.Join(RequiredControllers, ", "))
}

// CheckSoftDirty reports soft-dirty page tracking, which lets the
// inspector tell whether a long-lived process wrote memory. Optional.
func CheckSoftDirty(h Host) Check {
	c := Check{Name: "soft-dirty"}
	has, err := h.SoftDirty()
	switch {
	case err != nil:
		return warn(c, err.Error(), "a kernel with CONFIG_MEM_SOFT_DIRTY; without it a process that ran counts as changed")
	case !has:
		return warn(c, "kernel does not track soft-dirty pages", "a kernel with CONFIG_MEM_SOFT_DIRTY; without it a process that ran counts as changed")
	}
	return ok(c, "pagemap bit 55 set after a write")
}

// SoftDirtyBit reports bit 55 of a /proc/PID/pagemap entry.
func SoftDirtyBit(entry uint64) bool { return entry&(1<<55) != 0 }

// CheckFreeSpace warns when the file system of the state dir (or its
// nearest existing ancestor) has less than min bytes available.
func CheckFreeSpace(h Host, stateDir string, min uint64) Check {
	c := Check{Name: "free space"}
	dir := filepath.Clean(stateDir)
	for {
		if _, err := h.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	free, err := h.FreeBytes(dir)
	if err != nil {
		return warn(c, fmt.Sprintf("statfs %s: %v", dir, err), "")
	}
	detail := fmt.Sprintf("%s free on %s (state dir %s)", HumanBytes(free), dir, stateDir)
	if free < min {
		return warn(c, detail, fmt.Sprintf("free space or pick another --state-dir; below %s the pool and images may not fit", HumanBytes(min)))
	}
	return ok(c, detail)
}

// HumanBytes formats n in binary units ("12.3 GiB").
func HumanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Mount is one line of /proc/self/mountinfo, reduced to what the checks use.
type Mount struct {
	Point     string
	FSType    string
	SuperOpts string
}

// ParseMountinfo parses /proc/self/mountinfo content; malformed lines are
// skipped. Later mounts on the same point come later, as in the file.
func ParseMountinfo(s string) []Mount {
	var ms []Mount
	for _, l := range strings.Split(s, "\n") {
		f := strings.Fields(l)
		sep := slices.Index(f, "-")
		if sep < 5 || len(f) < sep+4 {
			continue
		}
		ms = append(ms, Mount{Point: unescapeOctal(f[4]), FSType: f[sep+1], SuperOpts: f[sep+3]})
	}
	return ms
}

// findMount returns the last (topmost) mount at point.
func findMount(ms []Mount, point string) (Mount, bool) {
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Point == point {
			return ms[i], true
		}
	}
	return Mount{}, false
}

func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			okOct := true
			for _, d := range s[i+1 : i+4] {
				if d < '0' || d > '7' {
					okOct = false
					break
				}
				v = v*8 + byte(d-'0')
			}
			if okOct {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func firstLine(out []byte, err error) string {
	s := strings.TrimSpace(string(out))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if err != nil {
		if s == "" {
			return err.Error()
		}
		return fmt.Sprintf("%v: %s", err, s)
	}
	return s
}

func ok(c Check, detail string) Check {
	c.Status, c.Detail = OK, detail
	return c
}

func warn(c Check, detail, remedy string) Check {
	c.Status, c.Detail, c.Remedy = Warn, detail, remedy
	return c
}

// fail marks a required check failed, an optional one warned.
func fail(c Check, detail, remedy string) Check {
	if !c.Required {
		return warn(c, detail, remedy)
	}
	c.Status, c.Detail, c.Remedy = Fail, detail, remedy
	return c
}
