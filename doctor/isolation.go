package doctor

import (
	"fmt"
	"strings"
)

// CheckIsolation reports the hardening every sandbox gets (docs/sandbox.md,
// "Isolation"): Docker's capability set, Docker's seccomp profile compiled
// with libseccomp, masked and read-only /proc paths, a device allow-list.
// Required: without seccomp filters in the kernel or libseccomp in this
// build, hardened sandboxes do not start.
func CheckIsolation(h Host, mountinfo string) Check {
	c := Check{Name: "isolation", Required: true}
	avail, err := h.ReadFile("/proc/sys/kernel/seccomp/actions_avail")
	if err != nil || !strings.Contains(string(avail), "errno") {
		return fail(c, "the kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)", "a kernel built with CONFIG_SECCOMP_FILTER")
	}
	version, insns, err := h.SeccompFilter()
	if err != nil {
		return fail(c, fmt.Sprintf("seccomp filter: %v", err), "build arbor with cgo and libseccomp-dev ("+remedyDeps+")")
	}
	detail := fmt.Sprintf("hardened: Docker's capability set, no_new_privs, seccomp (libseccomp %s, Docker's profile: %d BPF instructions), masked /proc paths", version, insns)
	devices := "device allow-list (eBPF on the v2 cgroup)"
	for _, m := range ParseMountinfo(mountinfo) {
		if m.FSType == "cgroup" && strings.Contains(","+m.SuperOpts+",", ",devices,") {
			devices = "device allow-list (eBPF on the v2 cgroup and the v1 devices cgroup)"
		}
	}
	return ok(c, detail+", "+devices)
}
