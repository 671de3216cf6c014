package imgcompare

import (
	"slices"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/cgroup"
	core_x86 "github.com/checkpoint-restore/go-criu/v7/crit/images/core-x86"
	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pipe"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/regfile"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/timer"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"google.golang.org/protobuf/proto"
)

func u32(v uint32) *uint32 { return &v }
func u64(v uint64) *uint64 { return &v }
func i32(v int32) *int32   { return &v }
func str(v string) *string { return &v }

func itimer(isec, vsec uint64) *timer.ItimerEntry {
	return &timer.ItimerEntry{Isec: u64(isec), Iusec: u64(0), Vsec: u64(vsec), Vusec: u64(0)}
}

// fabricated is a small image set: a shell (pid 13 in the sandbox's pid
// namespace) with a file open and a pipe, in the cgroup of sandbox
// "env1".
func fabricated() Set {
	core := &criu_core.CoreEntry{
		Mtype: criu_core.CoreEntry_X86_64.Enum(),
		Tc: &criu_core.TaskCoreEntry{
			TaskState: u32(1), Flags: u32(0x400000), BlkSigset: u64(0x10000), Comm: str("sh"),
			Timers: &timer.TaskTimersEntry{Real: itimer(0, 0), Virt: itimer(0, 0), Prof: itimer(0, 0)},
		},
		ThreadInfo: &core_x86.ThreadInfoX86{Gpregs: &core_x86.UserX86RegsEntry{Ip: u64(0x401000), Sp: u64(0x7ffd0000)}},
	}
	reg := &fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: u32(1),
		Reg: &regfile.RegFileEntry{Id: u32(1), Flags: u32(0), Pos: u64(1), Name: str("/work/f"), MntId: i32(705)}}
	pipeEnd := func(id, ino uint32) *fdinfo.FileEntry {
		return &fdinfo.FileEntry{Type: fdinfo.FdTypes_PIPE.Enum(), Id: u32(id), Pipe: &pipe.PipeEntry{Id: u32(id), PipeId: u32(ino), Flags: u32(0)}}
	}
	cg := &cgroup.CgroupEntry{Sets: []*cgroup.CgSetEntry{{Id: u32(1), Ctls: []*cgroup.CgMemberEntry{{Name: str("memory"), Path: str("/arbor/env1")}}}}}
	one := func(magic string, ms ...proto.Message) *Image {
		return &Image{Magic: magic, Entries: ms, Extra: make([]string, len(ms))}
	}
	fd := func(n, id uint32) proto.Message {
		return &fdinfo.FdinfoEntry{Id: u32(id), Flags: u32(0), Type: fdinfo.FdTypes_REG.Enum(), Fd: u32(n)}
	}
	return Set{
		"ids-13.img":   one("IDS", &criu_core.TaskKobjIdsEntry{VmId: u32(2), FilesId: u32(2), FsId: u32(2), SighandId: u32(2)}),
		"fdinfo-2.img": one("FDINFO", fd(3, 1), fd(4, 2), fd(5, 3), fd(6, 4)),
		"pstree.img": one("PSTREE", &pstree.PstreeEntry{Pid: u32(1), Ppid: u32(0), Pgid: u32(1), Sid: u32(1)},
			&pstree.PstreeEntry{Pid: u32(13), Ppid: u32(1), Pgid: u32(13), Sid: u32(13)}),
		"core-13.img": one("CORE", core),
		"files.img":   one("FILES", reg, pipeEnd(2, 33813263), pipeEnd(3, 33813263), pipeEnd(4, 33813264)),
		"cgroup.img":  one("CGROUP", cg),
	}
}

func clone(s Set) Set {
	c := Set{}
	for f, img := range s {
		n := &Image{Magic: img.Magic, Extra: slices.Clone(img.Extra)}
		for _, e := range img.Entries {
			n.Entries = append(n.Entries, proto.Clone(e))
		}
		c[f] = n
	}
	return c
}

func TestCompare(t *testing.T) {
	core := func(s Set) *criu_core.CoreEntry { return s["core-13.img"].Entries[0].(*criu_core.CoreEntry) }
	file := func(s Set, i int) *fdinfo.FileEntry { return s["files.img"].Entries[i].(*fdinfo.FileEntry) }
	tests := []struct {
		name   string
		change func(b Set)
		want   []string // "file field" of every difference reported
	}{
		{"equal", func(Set) {}, nil},
		{"an fd's position", func(b Set) { file(b, 0).Reg.Pos = u64(3) }, []string{"files.img [REG:/work/f@13:3].reg.pos"}},
		{"a signal mask", func(b Set) { core(b).Tc.BlkSigset = u64(0x10002) }, []string{"core-13.img [0].tc.blk_sigset"}},
		{"a timer's interval", func(b Set) { core(b).Tc.Timers.Real = itimer(5, 0) }, []string{"core-13.img [0].tc.timers.real.isec"}},
		{"a timer armed", func(b Set) { core(b).Tc.Timers.Real = itimer(0, 7) }, []string{"core-13.img [0].tc.timers.real.vsec"}},
		{"a process of the sandbox another pid", func(b Set) {
			b["pstree.img"].Entries[1].(*pstree.PstreeEntry).Pid = u32(14)
		}, []string{"pstree.img [pid=13].pgid", "pstree.img [pid=13].pid", "pstree.img [pid=13].ppid", "pstree.img [pid=13].sid",
			"pstree.img [pid=14].pgid", "pstree.img [pid=14].pid", "pstree.img [pid=14].ppid", "pstree.img [pid=14].sid"}},
		{"files numbered in another order", func(b Set) {
			f := b["files.img"]
			f.Entries[0], f.Entries[3] = f.Entries[3], f.Entries[0]
			file(b, 0).Id, file(b, 0).Pipe.Id = u32(1), u32(1)
			file(b, 3).Id, file(b, 3).Reg.Id = u32(4), u32(4)
			fds := b["fdinfo-2.img"].Entries
			fds[0].(*fdinfo.FdinfoEntry).Id, fds[3].(*fdinfo.FdinfoEntry).Id = u32(4), u32(1)
		}, nil},
		{"a pipe's two ends in two pipes", func(b Set) { file(b, 2).Pipe.PipeId = u32(33813264) }, []string{"files.img [PIPE@13:5].pipe.pipe_id"}},
		// Differences by design, normalised.
		{"registers", func(b Set) { core(b).ThreadInfo.Gpregs.Ip = u64(0x401234) }, nil},
		{"pipe inode numbers", func(b Set) {
			file(b, 1).Pipe.PipeId, file(b, 2).Pipe.PipeId, file(b, 3).Pipe.PipeId = u32(90001), u32(90001), u32(90002)
		}, nil},
		{"mount ids", func(b Set) { file(b, 0).Reg.MntId = i32(148) }, nil},
		{"a task CRIU forked", func(b Set) { core(b).Tc.Flags = u32(0x400040) }, nil},
		{"another cgroup", func(b Set) {
			b["cgroup.img"].Entries[0].(*cgroup.CgroupEntry).Sets[0].Ctls[0].Path = str("/arbor/env2-0/sub")
		}, []string{"cgroup.img [0].sets[0].ctls[0].path"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := fabricated()
			b := clone(a)
			// Another sandbox: its cgroup path names it.
			b["cgroup.img"].Entries[0].(*cgroup.CgroupEntry).Sets[0].Ctls[0].Path = str("/arbor/env2-0")
			tt.change(b)
			var got []string
			for _, d := range Compare(a, b, Options{RenameA: "env1", RenameB: "env2-0"}) {
				got = append(got, d.File+" "+d.Field)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("reported %q, want %q", got, tt.want)
			}
		})
	}
}

func TestTimeLeftIsNotADifference(t *testing.T) {
	a := fabricated()
	a["core-13.img"].Entries[0].(*criu_core.CoreEntry).Tc.Timers.Real = itimer(1, 5)
	b := clone(a)
	b["core-13.img"].Entries[0].(*criu_core.CoreEntry).Tc.Timers.Real = itimer(1, 3)
	if d := Compare(a, b, Options{}); len(d) != 0 {
		t.Errorf("two running timers with another time left differ: %v", d)
	}
}

// TestFileNames: an image named by a namespace id compares by the id's
// order, one named by a pid of the sandbox by the pid.
func TestFileNames(t *testing.T) {
	rn := newRenumber()
	if got := rn.fileName("mountpoints-13.img"); got != "mountpoints-#1.img" {
		t.Errorf("mountpoints-13.img compares as %s", got)
	}
	if got := rn.fileName("core-13.img"); got != "core-13.img" {
		t.Errorf("core-13.img (a pid of the sandbox) compares as %s", got)
	}
}

// TestSplitMappings: a mapping the kernel keeps split (a live library's
// RELRO) compares equal to the same range mapped as one; a gap in the
// file's offsets or another protection does not.
func TestSplitMappings(t *testing.T) {
	v := func(start, end, pgoff uint64, prot uint32) *vma.VmaEntry {
		return &vma.VmaEntry{Start: u64(start), End: u64(end), Pgoff: u64(pgoff), Shmid: u64(7), Prot: u32(prot), Flags: u32(2), Status: u32(65), Fd: proto.Int64(-1)}
	}
	set := func(vs ...*vma.VmaEntry) Set {
		return Set{"mm-13.img": &Image{Magic: "MM", Entries: []proto.Message{&mm.MmEntry{Vmas: vs}}, Extra: []string{""}}}
	}
	one := set(v(0x1000, 0x5000, 0, 1))
	tests := []struct {
		name string
		b    Set
		same bool
	}{
		{"split", set(v(0x1000, 0x3000, 0, 1), v(0x3000, 0x5000, 0x2000, 1)), true},
		{"another offset", set(v(0x1000, 0x3000, 0, 1), v(0x3000, 0x5000, 0x4000, 1)), false},
		{"another protection", set(v(0x1000, 0x3000, 0, 1), v(0x3000, 0x5000, 0x2000, 3)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Compare(one, tt.b, Options{})
			if (len(d) == 0) != tt.same {
				t.Errorf("same %v, reported %v", tt.same, d)
			}
		})
	}
	// A heap (anonymous: CRIU records offset 0) in two parts.
	anon := func(start, end uint64) *vma.VmaEntry {
		e := v(start, end, 0, 3)
		e.Shmid = u64(0)
		return e
	}
	if d := Compare(set(anon(0x1000, 0x5000)), set(anon(0x1000, 0x3000), anon(0x3000, 0x5000)), Options{}); len(d) != 0 {
		t.Errorf("a heap in two parts differs from it in one: %v", d)
	}
}

// TestHeapExtent: a heap that grew is not a difference; another mapping
// that grew is.
func TestHeapExtent(t *testing.T) {
	set := func(brk, end uint64, status uint32) Set {
		v := &vma.VmaEntry{Start: u64(0x1000), End: u64(end), Pgoff: u64(0), Shmid: u64(0), Prot: u32(3), Flags: u32(34), Status: u32(status), Fd: proto.Int64(-1)}
		return Set{"mm-13.img": &Image{Magic: "MM", Entries: []proto.Message{&mm.MmEntry{MmBrk: u64(brk), Vmas: []*vma.VmaEntry{v}}}, Extra: []string{""}}}
	}
	const heap, anon = 0x221, 0x201
	if d := Compare(set(0x5000, 0x5000, heap), set(0x9000, 0x9000, heap), Options{}); len(d) != 0 {
		t.Errorf("a heap that grew differs: %v", d)
	}
	if d := Compare(set(0x5000, 0x5000, anon), set(0x5000, 0x9000, anon), Options{}); len(d) != 1 {
		t.Errorf("a mapping that grew: reported %v, want its end", d)
	}
}
