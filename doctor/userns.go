package doctor

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// CheckUserNS reports whether sandboxes can run in user namespace mode
// (arbor serve --userns, docs/sandbox.md): the kernel lets root make user
// namespaces, and the host id range first..first+size-1 that ids inside
// map to belongs to no host user or group and to no sub-id range of
// /etc/subuid or /etc/subgid (someone else's containers would share ids
// with the sandboxes). Optional: the default mode does not need it.
func CheckUserNS(ctx context.Context, h Host, first, size uint32) Check {
	c := Check{Name: "user namespaces"}
	if b, err := h.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n == 0 {
			return fail(c, "user.max_user_namespaces is 0", "sysctl -w user.max_user_namespaces=15000 to use --userns")
		}
	}
	if out, err := h.Run(ctx, nil, "unshare", "--user", "--map-root-user", "true"); err != nil {
		return fail(c, "cannot make a user namespace: "+firstLine(out, err), "a kernel with CONFIG_USER_NS is needed for --userns")
	}
	last := uint64(first) + uint64(size) - 1
	var clashes []string
	for _, f := range []struct{ path, what string }{
		{"/etc/subuid", "sub-uids"}, {"/etc/subgid", "sub-gids"}, {"/etc/passwd", "uid"}, {"/etc/group", "gid"},
	} {
		b, err := h.ReadFile(f.path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			fs := strings.Split(line, ":")
			var lo, n uint64
			var err error
			switch {
			case strings.HasPrefix(f.path, "/etc/sub") && len(fs) == 3:
				lo, err = strconv.ParseUint(fs[1], 10, 32)
				if err == nil {
					n, err = strconv.ParseUint(fs[2], 10, 32)
				}
			case !strings.HasPrefix(f.path, "/etc/sub") && len(fs) >= 3:
				lo, err = strconv.ParseUint(fs[2], 10, 32)
				n = 1
			default:
				continue
			}
			if err != nil || n == 0 || lo > last || lo+n-1 < uint64(first) {
				continue
			}
			clashes = append(clashes, fmt.Sprintf("%s's %s (%s)", fs[0], f.what, f.path))
		}
	}
	rng := fmt.Sprintf("ids 0-%d map to host %d-%d", size-1, first, last)
	if len(clashes) > 0 {
		return warn(c, rng+", which "+strings.Join(clashes, ", ")+" also use", "pick a free range with --userns-range FIRST:SIZE")
	}
	return ok(c, "available (--userns): "+rng+", used by no host user or sub-id range")
}
