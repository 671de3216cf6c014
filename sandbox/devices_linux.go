package sandbox

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// deviceRule allows one character device, or a whole major when minor is
// negative (read, write and mknod).
type deviceRule struct{ major, minor int32 }

// allowedDeviceRules is allowedDevices for the eBPF device filter.
var allowedDeviceRules = []deviceRule{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}, {5, 2}, {136, -1}}

// deviceFilter is a BPF_PROG_TYPE_CGROUP_DEVICE program that allows the
// character devices in rules and denies everything else: the devices
// allow-list of cgroup v2, where the v1 devices controller does not
// exist. The kernel calls it with struct bpf_cgroup_dev_ctx {u32
// access_type (access << 16 | type); u32 major; u32 minor}.
func deviceFilter(rules []deviceRule) asm.Instructions {
	const charDev = 2 // BPF_DEVCG_DEV_CHAR
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
		asm.And.Imm(asm.R2, 0xffff),
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word),
		asm.LoadMem(asm.R4, asm.R1, 8, asm.Word),
		asm.JNE.Imm(asm.R2, charDev, "deny"),
	}
	for i, r := range rules {
		next := fmt.Sprintf("rule%d", i+1)
		insns = append(insns, asm.JNE.Imm(asm.R3, r.major, next))
		if r.minor >= 0 {
			insns = append(insns, asm.JNE.Imm(asm.R4, r.minor, next))
		}
		insns = append(insns, asm.Ja.Label("allow"))
		// the next rule starts at a labelled no-op
		insns = append(insns, asm.Mov.Imm(asm.R0, 0).WithSymbol(next))
	}
	return append(insns,
		asm.Mov.Imm(asm.R0, 0).WithSymbol("deny"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("allow"),
		asm.Return(),
	)
}

// attachDeviceFilter attaches the allow-list to the v2 cgroup dir. The
// attachment lives as long as the cgroup (no descriptor to keep open),
// and restored trees joined to the cgroup get it like started ones.
func attachDeviceFilter(dir string) error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.CGroupDevice, License: "Apache-2.0", Instructions: deviceFilter(allowedDeviceRules)})
	if err != nil {
		return fmt.Errorf("load device filter: %w", err)
	}
	defer prog.Close()
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("attach device filter: %w", err)
	}
	defer f.Close()
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: int(f.Fd()), Program: prog, Attach: ebpf.AttachCGroupDevice}); err != nil {
		return fmt.Errorf("attach device filter to %s: %w", dir, err)
	}
	return nil
}
