package doctor

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/seccomp"
)

// dumpTimeout bounds the criu dump probe; a healthy dump takes well
// under a second.
const dumpTimeout = 15 * time.Second

// NewHost returns the Host of the running machine.
func NewHost() Host { return linuxHost{} }

type linuxHost struct{}

func (linuxHost) Euid() int                             { return os.Geteuid() }
func (linuxHost) ReadFile(name string) ([]byte, error)  { return os.ReadFile(name) }
func (linuxHost) Stat(name string) (fs.FileInfo, error) { return os.Stat(name) }
func (linuxHost) LookPath(file string) (string, error)  { return exec.LookPath(file) }
func (linuxHost) MountTracefs() error                   { return mountTracefs() }

func (linuxHost) SeccompFilter() (string, int, error) {
	v, err := seccomp.LibraryVersion()
	if err != nil {
		return "", 0, err
	}
	p, err := seccomp.Compile(sandbox.DefaultCaps, nil)
	if err != nil {
		return v, 0, err
	}
	return v, p.Instructions(), nil
}
func (linuxHost) BPFTracepoint(group, name string) error { return bpfTracepoint(group, name) }

func (linuxHost) Run(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd.CombinedOutput()
}

func mountTracefs() error {
	if err := unix.Mount("tracefs", TracefsDir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount tracefs at %s: %w", TracefsDir, err)
	}
	return nil
}

func bpfTracepoint(group, name string) error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "arbor_doctor",
		Type:    ebpf.TracePoint,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	})
	if err != nil {
		return fmt.Errorf("load bpf program: %w", err)
	}
	defer prog.Close()
	l, err := link.Tracepoint(group, name, prog, nil)
	if err != nil {
		return fmt.Errorf("attach tracepoint %s/%s: %w", group, name, err)
	}
	return l.Close()
}

// CRIUDump starts `sleep` in a session of its own, dumps it into a
// temporary directory (criu kills it when done) and cleans up.
func (linuxHost) CRIUDump(ctx context.Context, criu string, env []string) (d time.Duration, err error) {
	dir, err := os.MkdirTemp("", "arbor-doctor-criu-")
	if err != nil {
		return 0, fmt.Errorf("make dump dir: %w", err)
	}
	defer os.RemoveAll(dir)
	sleep := exec.Command("sleep", "600")
	sleep.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleep.Start(); err != nil {
		return 0, fmt.Errorf("start sleep: %w", err)
	}
	defer func() {
		_ = sleep.Process.Kill()
		_ = sleep.Wait()
	}()

	ctx, cancel := context.WithTimeout(ctx, dumpTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, criu, "dump", "-t", strconv.Itoa(sleep.Process.Pid), "-D", dir, "-o", "dump.log", "-v2")
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d = time.Since(start)
	if ctx.Err() == context.DeadlineExceeded {
		return d, fmt.Errorf("criu dump after %s: %w", dumpTimeout, ErrTimeout)
	}
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
		return d, fmt.Errorf("criu dump: %w: %s", err, lastError(append(out, log...)))
	}
	return d, nil
}

// lastError returns the last "Error" line of criu output.
func lastError(b []byte) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		if bytes.Contains(lines[i], []byte("Error")) {
			return string(lines[i])
		}
	}
	if len(lines) > 0 {
		return string(lines[len(lines)-1])
	}
	return ""
}

func (linuxHost) CgroupChildHas(dir, file string) (bool, error) {
	child := filepath.Join(dir, fmt.Sprintf("arbor-doctor-%d", os.Getpid()))
	if err := os.Mkdir(child, 0o755); err != nil {
		return false, fmt.Errorf("make cgroup %s: %w", child, err)
	}
	defer os.Remove(child)
	_, err := os.Stat(filepath.Join(child, file))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// SoftDirty writes a fresh page, clears soft-dirty bits (clear_refs 4),
// writes it again and reads its pagemap entry.
func (linuxHost) SoftDirty() (bool, error) {
	page := os.Getpagesize()
	mem, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return false, fmt.Errorf("mmap: %w", err)
	}
	defer unix.Munmap(mem)
	mem[0] = 1
	if err := os.WriteFile("/proc/self/clear_refs", []byte("4"), 0); err != nil {
		return false, fmt.Errorf("clear soft-dirty bits: %w", err)
	}
	mem[0] = 2
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return false, fmt.Errorf("open pagemap: %w", err)
	}
	defer f.Close()
	var entry [8]byte
	addr := uint64(uintptrOf(mem))
	if _, err := f.ReadAt(entry[:], int64(addr/uint64(page)*8)); err != nil {
		return false, fmt.Errorf("read pagemap: %w", err)
	}
	return SoftDirtyBit(binary.LittleEndian.Uint64(entry[:])), nil
}

func (linuxHost) FreeBytes(path string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

func (linuxHost) ProcessRunning(comm string) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err == nil && string(bytes.TrimSpace(b)) == comm {
			return true
		}
	}
	return false
}
