package bpf

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// tracefsDir is where the classic tracepoints' ids are looked up.
const tracefsDir = "/sys/kernel/tracing"

// Tracker is the loaded and attached programs plus the ring buffer reader.
// Track, Untrack, NewEpoch and Lost are safe for concurrent use; Read is
// for one goroutine.
type Tracker struct {
	objs  trackerObjects
	links []link.Link
	rd    *ringbuf.Reader
	rec   ringbuf.Record
}

// Open loads the programs, attaches them and opens the ring buffer. It
// mounts tracefs when nothing has. Errors that mean "no eBPF here" wrap
// ErrUnavailable.
func Open() (t *Tracker, err error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("%w: programs decode x86_64 syscalls, this is %s", ErrUnavailable, runtime.GOARCH)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: loading programs needs root", ErrUnavailable)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: remove memlock limit: %v", ErrUnavailable, err)
	}
	if err := mountTracefs(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	t = &Tracker{}
	if err := loadTrackerObjects(&t.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("%w: verifier: %w", ErrUnavailable, err)
		}
		return nil, fmt.Errorf("%w: load programs: %v", ErrUnavailable, err)
	}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	// The classes go in before the programs attach: an empty map would
	// make every call unknown, an effect.
	for nr, c := range Syscalls {
		if err := t.objs.Classes.Update(nr, uint32(c.Class), ebpf.UpdateAny); err != nil {
			return nil, fmt.Errorf("set class of syscall %d: %w", nr, err)
		}
	}
	raw := []struct {
		name string
		prog *ebpf.Program
	}{
		{"sys_enter", t.objs.SysEnter},
		{"sys_exit", t.objs.SysExit},
		{"sched_process_fork", t.objs.ProcessFork},
	}
	for _, r := range raw {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: r.name, Program: r.prog})
		if err != nil {
			return nil, fmt.Errorf("%w: attach raw tracepoint %s: %v", ErrUnavailable, r.name, err)
		}
		t.links = append(t.links, l)
	}
	for _, tp := range []struct {
		name string
		prog *ebpf.Program
	}{{"sched_process_exec", t.objs.ProcessExec}, {"sched_process_exit", t.objs.ProcessExit}} {
		l, err := link.Tracepoint("sched", tp.name, tp.prog, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: attach tracepoint sched/%s: %v", ErrUnavailable, tp.name, err)
		}
		t.links = append(t.links, l)
	}
	if t.rd, err = ringbuf.NewReader(t.objs.Events); err != nil {
		return nil, fmt.Errorf("%w: open ring buffer: %v", ErrUnavailable, err)
	}
	return t, nil
}

// mountTracefs mounts tracefs at its usual place unless it is there.
func mountTracefs() error {
	if _, err := os.Stat(tracefsDir + "/events"); err == nil {
		return nil
	}
	if err := os.MkdirAll(tracefsDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", tracefsDir, err)
	}
	if err := unix.Mount("tracefs", tracefsDir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount tracefs on %s: %w", tracefsDir, err)
	}
	return nil
}

// Track makes the programs report the tasks of cgroup id cgid.
func (t *Tracker) Track(cgid uint64) error {
	if err := t.objs.Cgroups.Update(cgid, trackerTracked{Epoch: 1}, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("track cgroup %d: %w", cgid, err)
	}
	return nil
}

// Untrack stops reporting cgroup cgid.
func (t *Tracker) Untrack(cgid uint64) error {
	if err := t.objs.Cgroups.Delete(cgid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("untrack cgroup %d: %w", cgid, err)
	}
	return nil
}

// NewEpoch makes the next write or stream call through every open file of
// cgroup cgid, and the next call of each effect syscall, be reported again
// (they are reported once per file, or per number, and epoch).
func (t *Tracker) NewEpoch(cgid uint64) error {
	var v trackerTracked
	if err := t.objs.Cgroups.Lookup(cgid, &v); err != nil {
		return fmt.Errorf("new epoch of cgroup %d: %w", cgid, err)
	}
	v.Epoch++
	v.Seen = [8]uint64{}
	if err := t.objs.Cgroups.Update(cgid, v, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("new epoch of cgroup %d: %w", cgid, err)
	}
	return nil
}

// Lost returns how many events the ring buffer had no room for since load.
func (t *Tracker) Lost() (uint64, error) {
	var n uint64
	if err := t.objs.Lost.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("read lost-event counter: %w", err)
	}
	return n, nil
}

// Returns is how many syscalls of process tgid returned to user mode since
// it was first seen (see tracker.c); ok is false when none was counted.
func (t *Tracker) Returns(tgid uint32) (n uint64, ok bool) {
	if err := t.objs.Returns.Lookup(tgid, &n); err != nil {
		return 0, false
	}
	return n, true
}

// Read blocks for the next event. After Flush it returns ErrFlushed once
// every event pending at the time has been read; after Close, ErrClosed.
func (t *Tracker) Read() (Event, error) {
	if err := t.rd.ReadInto(&t.rec); err != nil {
		switch {
		case errors.Is(err, ringbuf.ErrFlushed):
			return Event{}, ErrFlushed
		case errors.Is(err, os.ErrClosed):
			return Event{}, ErrClosed
		}
		return Event{}, fmt.Errorf("read ring buffer: %w", err)
	}
	return Decode(t.rec.RawSample)
}

// Flush makes a blocked or the next Read return what is pending, then
// ErrFlushed.
func (t *Tracker) Flush() error { return t.rd.Flush() }

// Pending is how many bytes wait in the ring buffer.
func (t *Tracker) Pending() int { return t.rd.AvailableBytes() }

// Close detaches the programs and frees everything.
func (t *Tracker) Close() error {
	var errs []error
	if t.rd != nil {
		errs = append(errs, t.rd.Close())
	}
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	t.links = nil
	errs = append(errs, t.objs.Close())
	return errors.Join(errs...)
}
