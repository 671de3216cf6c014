package doctor

import (
	"fmt"
	"strconv"
	"strings"
)

// CheckIsolation reports the hardening every sandbox gets (docs/sandbox.md,
// "Isolation"): Docker's capability set, Docker's seccomp profile compiled
// with libseccomp, masked and read-only /proc paths, a devices cgroup.
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
	devices := false
	for _, m := range ParseMountinfo(mountinfo) {
		if m.FSType == "cgroup" && strings.Contains(","+m.SuperOpts+",", ",devices,") {
			devices = true
		}
	}
	if !devices {
		return warn(c, detail+"; no v1 devices cgroup: the device allow-list is not enforced",
			"mount the v1 devices hierarchy at /sys/fs/cgroup/devices (pure cgroup v2 hosts: not supported yet)")
	}
	return ok(c, detail+", devices cgroup allow-list")
}

// CheckUserNS reports whether the kernel lets processes make user
// namespaces (/proc/sys/user/max_user_namespaces > 0). Optional.
func CheckUserNS(h Host) Check {
	c := Check{Name: "user namespaces"}
	b, err := h.ReadFile("/proc/sys/user/max_user_namespaces")
	if err != nil {
		return warn(c, "not supported (no /proc/sys/user/max_user_namespaces)", "a kernel built with CONFIG_USER_NS")
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return warn(c, fmt.Sprintf("not supported (max_user_namespaces %q)", strings.TrimSpace(string(b))), "sysctl user.max_user_namespaces=10000")
	}
	return ok(c, fmt.Sprintf("supported (max %d)", n))
}
