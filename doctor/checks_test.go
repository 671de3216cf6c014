package doctor

import (
	"context"
	"errors"
	"io/fs"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeHost answers from maps; absent entries are "not found".
type fakeHost struct {
	euid      int
	files     map[string]string
	paths     map[string]string // LookPath results
	execs     map[string]bool   // Stat: executable files
	runs      map[string]string // "name arg" -> output; absent: error
	dumpErr   error
	dumpFault error // dump result with CRIU_FAULT=130
	mountErr  error
	mounted   bool
	bpfErr    error
	freeze    bool
	softDirty bool
	free      uint64
	procs     []string
	scmpErr   error
}

type fakeInfo struct{ fs.FileInfo }

func (fakeInfo) IsDir() bool       { return false }
func (fakeInfo) Mode() fs.FileMode { return 0o755 }

func (f *fakeHost) Euid() int { return f.euid }
func (f *fakeHost) ReadFile(n string) ([]byte, error) {
	s, ok := f.files[n]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return []byte(s), nil
}
func (f *fakeHost) Stat(n string) (fs.FileInfo, error) {
	if f.execs[n] {
		return fakeInfo{}, nil
	}
	if _, ok := f.files[n]; ok {
		return fakeInfo{}, nil
	}
	return nil, fs.ErrNotExist
}
func (f *fakeHost) LookPath(n string) (string, error) {
	if p, ok := f.paths[n]; ok {
		return p, nil
	}
	return "", exec.ErrNotFound
}
func (f *fakeHost) Run(_ context.Context, _ []string, name string, args ...string) ([]byte, error) {
	out, ok := f.runs[name+" "+strings.Join(args, " ")]
	if !ok {
		return []byte("boom"), errors.New("exit status 1")
	}
	return []byte(out), nil
}
func (f *fakeHost) CRIUDump(_ context.Context, _ string, env []string) (time.Duration, error) {
	if slices.Contains(env, "CRIU_FAULT=130") {
		return time.Millisecond, f.dumpFault
	}
	return 50 * time.Millisecond, f.dumpErr
}
func (f *fakeHost) MountTracefs() error {
	if f.mountErr == nil {
		f.mounted = true
	}
	return f.mountErr
}
func (f *fakeHost) BPFTracepoint(string, string) error { return f.bpfErr }
func (f *fakeHost) CgroupChildHas(string, string) (bool, error) {
	return f.freeze, nil
}
func (f *fakeHost) SoftDirty() (bool, error)         { return f.softDirty, nil }
func (f *fakeHost) FreeBytes(string) (uint64, error) { return f.free, nil }
func (f *fakeHost) ProcessRunning(c string) bool     { return slices.Contains(f.procs, c) }
func (f *fakeHost) SeccompFilter() (string, int, error) {
	if f.scmpErr != nil {
		return "", 0, f.scmpErr
	}
	return "2.5.4", 1400, nil
}

const hybridMountinfo = `25 1 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
28 25 0:25 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
31 25 0:27 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices
29 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
30 1 0:12 / /sys/kernel/tracing rw - tracefs tracefs rw
`

const pureV2Mountinfo = `25 1 0:22 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw,nsdelegate
`

// healthy is this project's reference host after make deps.
func healthy() *fakeHost {
	return &fakeHost{
		files: map[string]string{
			"/proc/filesystems":                      "nodev\tsysfs\n\tbtrfs\n\text4\n",
			"/proc/sys/kernel/seccomp/actions_avail": "kill_process kill_thread trap errno user_notif trace log allow\n",
			"/proc/sys/user/max_user_namespaces":     "96365\n",
			"/proc/self/mountinfo":                   hybridMountinfo,
			"/var/lib":                               "",
		},
		paths: map[string]string{"mkfs.btrfs": "/usr/sbin/mkfs.btrfs", "zfs": "/usr/sbin/zfs", "zpool": "/usr/sbin/zpool", "zfs-fuse": "/usr/sbin/zfs-fuse"},
		execs: map[string]bool{"/opt/arbor/criu/bin/criu": true},
		runs: map[string]string{
			"/opt/arbor/criu/bin/criu --version": "Version: 4.2.1\n",
			"/opt/arbor/criu/bin/criu check":     "Looks good.\n",
		},
		freeze: true,
		free:   80 << 30,
		procs:  []string{"zfs-fuse"},
	}
}

func statusOf(r Report, name string) Check {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return Check{Name: name, Status: "absent"}
}

func TestRun(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*fakeHost)
		opts   Options
		check  string
		want   Status
		wantOK bool
		detail string // substring of the check's detail
	}{
		{name: "healthy", modify: func(*fakeHost) {}, check: "criu", want: OK, wantOK: true, detail: "4.2"},
		{name: "soft-dirty missing only warns", modify: func(*fakeHost) {}, check: "soft-dirty", want: Warn, wantOK: true},
		{name: "not root", modify: func(h *fakeHost) { h.euid = 1000 }, check: "root", want: Fail, detail: "uid 1000"},
		{name: "no criu", modify: func(h *fakeHost) { h.execs = nil }, check: "criu", want: Fail, detail: "not found"},
		{name: "criu 3.17", modify: func(h *fakeHost) {
			h.runs["/opt/arbor/criu/bin/criu --version"] = "Version: 3.17.1\n"
		}, check: "criu", want: Fail, detail: "3.17"},
		{name: "criu from flag", modify: func(h *fakeHost) {
			h.execs["/usr/local/sbin/criu"] = true
			h.runs["/usr/local/sbin/criu --version"] = "Version: 4.2\n"
			h.runs["/usr/local/sbin/criu check"] = "Looks good.\n"
		}, opts: Options{CRIUFlag: "/usr/local/sbin/criu"}, check: "criu", want: OK, wantOK: true, detail: "/usr/local/sbin/criu (4.2)"},
		{name: "criu check fails", modify: func(h *fakeHost) { delete(h.runs, "/opt/arbor/criu/bin/criu check") }, check: "criu check", want: Fail},
		{name: "dump hangs without breakpoints", modify: func(h *fakeHost) { h.dumpErr = ErrTimeout }, check: "criu dump", want: Fail, detail: "CRIU_FAULT=130"},
		{name: "no mkfs.btrfs", modify: func(h *fakeHost) { delete(h.paths, "mkfs.btrfs") }, check: "btrfs", want: Fail},
		{name: "kernel without btrfs", modify: func(h *fakeHost) { h.files["/proc/filesystems"] = "nodev\tsysfs\n\text4\n" }, check: "btrfs", want: Fail, detail: "kernel"},
		{name: "zfs-fuse daemon down warns", modify: func(h *fakeHost) { h.procs = nil }, check: "zfs", want: Warn, wantOK: true, detail: "not running"},
		{name: "openzfs module", modify: func(h *fakeHost) { h.files["/sys/module/zfs"] = "" }, check: "zfs", want: OK, wantOK: true, detail: "OpenZFS"},
		{name: "no zfs tools warns", modify: func(h *fakeHost) { delete(h.paths, "zpool") }, check: "zfs", want: Warn, wantOK: true},
		{name: "backend zfs: no zfs tools fails", modify: func(h *fakeHost) { delete(h.paths, "zpool") }, opts: Options{Backend: "zfs"}, check: "zfs", want: Fail},
		{name: "backend zfs: no btrfs only warns", modify: func(h *fakeHost) { delete(h.paths, "mkfs.btrfs") }, opts: Options{Backend: "zfs"}, check: "btrfs", want: Warn, wantOK: true},
		{name: "backend zfs: zfs-fuse down is started by serve", modify: func(h *fakeHost) {
			h.procs = nil
			h.files["/dev/fuse"] = ""
		}, opts: Options{Backend: "zfs", StateDir: "/var/lib/arbor"}, check: "zfs", want: OK, wantOK: true, detail: "daemon not running: arbor serve starts it; own pool file in /var/lib/arbor/zfs"},
		{name: "backend zfs: zfs-fuse down without /dev/fuse fails", modify: func(h *fakeHost) { h.procs = nil }, opts: Options{Backend: "zfs"}, check: "zfs", want: Fail, detail: "/dev/fuse"},
		{name: "backend zfs: zfs-fuse gets the shim", modify: func(h *fakeHost) {
			h.runs["/usr/sbin/zfs list -Hp -o name"] = "invalid option 'p'"
		}, opts: Options{Backend: "zfs", ZFSDataset: "tank/arbor"}, check: "zfs", want: OK, wantOK: true, detail: "daemon running; zfs list lacks -p: arbor serve wires its compatibility shim; dataset tank/arbor"},
		{name: "backend zfs: openzfs uses the dataset as is", modify: func(h *fakeHost) { h.files["/sys/module/zfs"] = "" }, opts: Options{Backend: "zfs", ZFSDataset: "tank/arbor"}, check: "zfs", want: OK, wantOK: true, detail: "OpenZFS kernel module; dataset tank/arbor (ARBOR_ZFS_DATASET)"},
		{name: "tracefs mounted by the check", modify: func(h *fakeHost) {
			h.files["/proc/self/mountinfo"] = strings.Replace(hybridMountinfo, "30 1 0:12 / /sys/kernel/tracing rw - tracefs tracefs rw\n", "", 1)
		}, check: "tracefs", want: OK, wantOK: true, detail: "by this check"},
		{name: "tracefs cannot mount", modify: func(h *fakeHost) {
			h.files["/proc/self/mountinfo"] = strings.Replace(hybridMountinfo, "30 1 0:12 / /sys/kernel/tracing rw - tracefs tracefs rw\n", "", 1)
			h.mountErr = errors.New("permission denied")
		}, check: "tracefs", want: Fail},
		{name: "bpf fails", modify: func(h *fakeHost) { h.bpfErr = errors.New("operation not permitted") }, check: "bpf", want: Fail},
		{name: "no freeze", modify: func(h *fakeHost) { h.freeze = false }, check: "cgroup v2", want: Fail},
		{name: "no cgroup2", modify: func(h *fakeHost) {
			h.files["/proc/self/mountinfo"] = strings.Replace(hybridMountinfo, "cgroup2 cgroup2", "tmpfs tmpfs", 1)
		}, check: "cgroup v2", want: Fail},
		{name: "pure v2", modify: func(h *fakeHost) {
			h.files["/proc/self/mountinfo"] = pureV2Mountinfo + "30 1 0:12 / /sys/kernel/tracing rw - tracefs tracefs rw\n"
			h.files["/sys/fs/cgroup/cgroup.controllers"] = "cpuset cpu io memory hugetlb pids rdma misc\n"
		}, check: "cgroup v2", want: OK, wantOK: true, detail: "/sys/fs/cgroup,"},
		{name: "pure v2 without pids", modify: func(h *fakeHost) {
			h.files["/proc/self/mountinfo"] = pureV2Mountinfo + "30 1 0:12 / /sys/kernel/tracing rw - tracefs tracefs rw\n"
			h.files["/sys/fs/cgroup/cgroup.controllers"] = "cpu memory\n"
		}, check: "cgroup controllers", want: Fail, detail: "pids"},
		{name: "v1 without memory", modify: func(h *fakeHost) {
			h.files["/proc/self/mountinfo"] = strings.Replace(hybridMountinfo, "rw,memory", "rw,blkio", 1)
		}, check: "cgroup controllers", want: Fail, detail: "memory"},
		{name: "hardened", modify: func(*fakeHost) {}, check: "isolation", want: OK, wantOK: true, detail: "libseccomp 2.5.4, Docker's profile: 1400 BPF instructions), masked /proc paths, device allow-list (eBPF on the v2 cgroup and the v1 devices cgroup)"},
		{name: "no libseccomp", modify: func(h *fakeHost) { h.scmpErr = errors.New("built without cgo") }, check: "isolation", want: Fail, detail: "without cgo"},
		{name: "kernel without seccomp filters", modify: func(h *fakeHost) { delete(h.files, "/proc/sys/kernel/seccomp/actions_avail") }, check: "isolation", want: Fail, detail: "CONFIG_SECCOMP_FILTER"},
		{name: "no v1 devices cgroup", modify: func(h *fakeHost) {
			h.files["/proc/self/mountinfo"] = strings.Replace(hybridMountinfo, "rw,devices", "rw,blkio", 1)
		}, check: "isolation", want: OK, wantOK: true, detail: "device allow-list (eBPF on the v2 cgroup)"},
		{name: "low space warns", modify: func(h *fakeHost) { h.free = 1 << 30 }, check: "free space", want: Warn, wantOK: true, detail: "1.0 GiB free on /var/lib"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := healthy()
			tt.modify(h)
			o := tt.opts
			o.StateDir = "/var/lib/arbor"
			r := Run(context.Background(), h, o)
			c := statusOf(r, tt.check)
			if c.Status != tt.want {
				t.Errorf("%s: status %s (%s), want %s", tt.check, c.Status, c.Detail, tt.want)
			}
			if !strings.Contains(c.Detail, tt.detail) {
				t.Errorf("%s: detail %q lacks %q", tt.check, c.Detail, tt.detail)
			}
			if c.Status != OK && c.Remedy == "" && c.Name != "root" {
				t.Errorf("%s: %s without a remedy", tt.check, c.Status)
			}
			if r.OK != tt.wantOK {
				t.Errorf("report OK = %v, want %v; checks: %+v", r.OK, tt.wantOK, r.Checks)
			}
		})
	}
}

func TestParseMountinfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Mount
	}{
		{name: "optional fields", in: "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue\n",
			want: []Mount{{Point: "/mnt/parent", FSType: "ext3", SuperOpts: "rw,errors=continue"}}},
		{name: "escaped space", in: `40 1 0:50 / /mnt/a\040b rw - btrfs /dev/loop0 rw` + "\n",
			want: []Mount{{Point: "/mnt/a b", FSType: "btrfs", SuperOpts: "rw"}}},
		{name: "malformed skipped", in: "garbage\n\n", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseMountinfo(tt.in); !slices.Equal(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSmallHelpers(t *testing.T) {
	tests := []struct {
		name string
		got  any
		want any
	}{
		{name: "soft-dirty bit set", got: SoftDirtyBit(1<<55 | 1<<63), want: true},
		{name: "soft-dirty bit clear", got: SoftDirtyBit(1 << 63), want: false},
		{name: "btrfs listed", got: HasFilesystem("nodev\tproc\n\tbtrfs\n", "btrfs"), want: true},
		{name: "btrfs prefix is not btrfs", got: HasFilesystem("\tbtrfsx\n", "btrfs"), want: false},
		{name: "bytes", got: HumanBytes(512), want: "512 B"},
		{name: "kibibytes", got: HumanBytes(1536), want: "1.5 KiB"},
		{name: "mebibytes", got: HumanBytes(3 << 20), want: "3.0 MiB"},
		{name: "gibibytes", got: HumanBytes(5 << 30), want: "5.0 GiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Fatalf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}
