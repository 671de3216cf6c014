//go:build linux && cgo

package seccomp

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"

	profile "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

var (
	cacheMu sync.Mutex
	cache   = map[string]*Program{}
	logOnce sync.Once
)

// Compile returns the filter for a sandbox keeping caps (CAP_ names, as
// sandbox.CapSet.Names gives them), compiled once per distinct set. log
// (nil: slog.Default) hears once, at debug level, which syscalls
// libseccomp did not know.
func Compile(caps []string, log *slog.Logger) (*Program, error) {
	key := slices.Clone(caps)
	slices.Sort(key)
	k := strings.Join(key, ",")
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if p, ok := cache[k]; ok {
		return p, nil
	}
	p, err := compile(key)
	if err != nil {
		return nil, err
	}
	if len(p.Skipped) > 0 {
		if log == nil {
			log = slog.Default()
		}
		logOnce.Do(func() {
			log.Debug("seccomp: syscalls of the profile unknown to libseccomp are left denied",
				slog.Int("count", len(p.Skipped)), slog.String("syscalls", strings.Join(p.Skipped, " ")))
		})
	}
	cache[k] = p
	return p, nil
}

// LibraryVersion is the version of the libseccomp in use.
func LibraryVersion() (string, error) {
	maj, min, mic := libseccomp.GetLibraryVersion()
	if maj == 0 && min == 0 {
		return "", fmt.Errorf("%w: libseccomp not found", ErrUnsupported)
	}
	return fmt.Sprintf("%d.%d.%d", maj, min, mic), nil
}

// ioctls nobody in a sandbox may issue. TIOCSTI pushes bytes into a
// terminal's input queue (typing into the persistent shell), TIOCLINUX
// has a selection-paste subcommand that does the same on a console. The
// btrfs subvolume and snapshot creation ioctls need no capability, and a
// subvolume made inside a sandbox root would escape its disk quota
// (docs/sandbox.md, Disk quota); their numbers are from linux/btrfs.h.
var deniedIoctls = []uint32{unix.TIOCSTI, unix.TIOCLINUX,
	btrfsIocSnapCreate, btrfsIocSubvolCreate, btrfsIocSnapCreateV2, btrfsIocSubvolCreateV2}

const (
	btrfsIocSnapCreate     = 0x50009401
	btrfsIocSubvolCreate   = 0x5000940e
	btrfsIocSnapCreateV2   = 0x50009417
	btrfsIocSubvolCreateV2 = 0x50009418
)

func compile(caps []string) (*Program, error) {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	prof, err := profile.GetDefaultProfile(spec)
	if err != nil {
		return nil, fmt.Errorf("build seccomp profile: %w", err)
	}
	defAct, err := action(prof.DefaultAction, prof.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("seccomp default action: %w", err)
	}
	f, err := libseccomp.NewFilter(defAct)
	if err != nil {
		return nil, fmt.Errorf("%w: new filter: %v", ErrUnsupported, err)
	}
	defer f.Release()
	for _, a := range prof.Architectures {
		arch, err := libseccomp.GetArchFromString(strings.TrimPrefix(strings.ToLower(string(a)), "scmp_arch_"))
		if err != nil {
			return nil, fmt.Errorf("seccomp architecture %s: %w", a, err)
		}
		if err := f.AddArch(arch); err != nil {
			return nil, fmt.Errorf("seccomp architecture %s: %w", a, err)
		}
	}
	// A binary tree instead of a linear list of syscall checks: runc does
	// the same for long rule sets.
	if err := f.SetOptimize(2); err != nil {
		return nil, fmt.Errorf("seccomp optimize: %w", err)
	}
	p := &Program{}
	ioctlAllowed := false
	for _, sc := range prof.Syscalls {
		act, err := action(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("seccomp rule %v: %w", sc.Names, err)
		}
		if act == defAct {
			continue // libseccomp refuses rules that repeat the default
		}
		for _, name := range sc.Names {
			if name == "ioctl" {
				if act != libseccomp.ActAllow || len(sc.Args) > 0 {
					return nil, fmt.Errorf("seccomp profile has a rule for ioctl Arbor cannot combine with its TIOCSTI rule")
				}
				ioctlAllowed = true
				continue
			}
			num, err := libseccomp.GetSyscallFromName(name)
			if err != nil {
				p.Skipped = append(p.Skipped, name)
				continue
			}
			if err := addRule(f, num, act, sc.Args); err != nil {
				return nil, fmt.Errorf("seccomp rule for %s: %w", name, err)
			}
		}
	}
	if ioctlAllowed {
		num, err := libseccomp.GetSyscallFromName("ioctl")
		if err != nil {
			return nil, fmt.Errorf("seccomp: ioctl: %w", err)
		}
		for _, mv := range AllBut(deniedIoctls) {
			c, err := libseccomp.MakeCondition(1, libseccomp.CompareMaskedEqual, uint64(mv.Mask), uint64(mv.Value))
			if err != nil {
				return nil, fmt.Errorf("seccomp ioctl condition: %w", err)
			}
			if err := f.AddRuleConditional(num, libseccomp.ActAllow, []libseccomp.ScmpCondition{c}); err != nil {
				return nil, fmt.Errorf("seccomp ioctl rule: %w", err)
			}
		}
	}
	if p.BPF, err = export(f); err != nil {
		return nil, err
	}
	slices.Sort(p.Skipped)
	p.Skipped = slices.Compact(p.Skipped)
	return p, nil
}

// addRule adds one profile rule. Conditions on distinct arguments must all
// hold (one rule); several on the same argument become one rule each, as
// runc does (libseccomp cannot AND them).
func addRule(f *libseccomp.ScmpFilter, num libseccomp.ScmpSyscall, act libseccomp.ScmpAction, args []specs.LinuxSeccompArg) error {
	if len(args) == 0 {
		return f.AddRule(num, act)
	}
	var conds []libseccomp.ScmpCondition
	perArg := map[uint]int{}
	for _, a := range args {
		op, err := operator(a.Op)
		if err != nil {
			return err
		}
		c, err := libseccomp.MakeCondition(a.Index, op, a.Value, a.ValueTwo)
		if err != nil {
			return err
		}
		conds = append(conds, c)
		perArg[a.Index]++
	}
	for _, n := range perArg {
		if n > 1 {
			for _, c := range conds {
				if err := f.AddRuleConditional(num, act, []libseccomp.ScmpCondition{c}); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return f.AddRuleConditional(num, act, conds)
}

func action(a specs.LinuxSeccompAction, errno *uint) (libseccomp.ScmpAction, error) {
	switch a {
	case specs.ActAllow:
		return libseccomp.ActAllow, nil
	case specs.ActErrno:
		code := int16(unix.EPERM)
		if errno != nil {
			code = int16(*errno)
		}
		return libseccomp.ActErrno.SetReturnCode(code), nil
	case specs.ActKill, specs.ActKillThread:
		return libseccomp.ActKillThread, nil
	case specs.ActKillProcess:
		return libseccomp.ActKillProcess, nil
	case specs.ActTrap:
		return libseccomp.ActTrap, nil
	case specs.ActLog:
		return libseccomp.ActLog, nil
	}
	return libseccomp.ActInvalid, fmt.Errorf("seccomp action %q not supported", a)
}

func operator(op specs.LinuxSeccompOperator) (libseccomp.ScmpCompareOp, error) {
	switch op {
	case specs.OpEqualTo:
		return libseccomp.CompareEqual, nil
	case specs.OpNotEqual:
		return libseccomp.CompareNotEqual, nil
	case specs.OpGreaterThan:
		return libseccomp.CompareGreater, nil
	case specs.OpGreaterEqual:
		return libseccomp.CompareGreaterEqual, nil
	case specs.OpLessThan:
		return libseccomp.CompareLess, nil
	case specs.OpLessEqual:
		return libseccomp.CompareLessOrEqual, nil
	case specs.OpMaskedEqual:
		return libseccomp.CompareMaskedEqual, nil
	}
	return libseccomp.CompareInvalid, fmt.Errorf("seccomp operator %q not supported", op)
}

// export writes the filter as BPF through a memfd (libseccomp writes to a
// descriptor; seccomp_export_bpf_mem needs libseccomp 2.6).
func export(f *libseccomp.ScmpFilter) ([]byte, error) {
	fd, err := unix.MemfdCreate("arbor-seccomp", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("seccomp export: %w", err)
	}
	file := os.NewFile(uintptr(fd), "arbor-seccomp")
	defer file.Close()
	if err := f.ExportBPF(file); err != nil {
		return nil, fmt.Errorf("seccomp export: %w", err)
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("seccomp export: %w", err)
	}
	b, err := io.ReadAll(file)
	if err != nil {
		return nil, fmt.Errorf("seccomp export: %w", err)
	}
	if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > 4096 {
		return nil, errors.New("seccomp export: not a BPF program of 1 to 4096 instructions")
	}
	return b, nil
}
