package initd

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// PrepareDev makes root/dev as stage one would, from the host: in user
// namespace mode stage one may not mknod, and finds the nodes already right.
func PrepareDev(root string) error { return makeDev(root, true) }

// becomeNSRoot makes stage one, started by host root in a fresh user
// namespace (where host root is unmapped), the namespace's root, so that
// stage two and the shell run as uid 0 inside and as the mapped host id
// outside. Outside user namespace mode it does nothing.
func becomeNSRoot() error {
	own, err := inOwnUserNS()
	if err != nil {
		return err
	}
	if !own {
		return nil // the initial user namespace (or an identity map)
	}
	// syscall's set*id calls change every thread of the process, which
	// the exec of stage two needs.
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(0, 0, 0); err != nil {
		return fmt.Errorf("setresgid 0: %w", err)
	}
	if err := syscall.Setresuid(0, 0, 0); err != nil {
		return fmt.Errorf("setresuid 0: %w", err)
	}
	// Stage one got its capabilities as ambient ones (sandbox.applyUserNS);
	// as root of the namespace it has them anyway, and nothing it starts
	// may inherit them as a non-root user. Capabilities are per thread:
	// this is the main thread, which execs stage two.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear inheritable capabilities: %w", err)
	}
	return nil
}

// inOwnUserNS reports whether this process runs in a user namespace of its
// own (user namespace mode) rather than the host's.
func inOwnUserNS() (bool, error) {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false, fmt.Errorf("read uid_map: %w", err)
	}
	f := strings.Fields(string(b))
	return !(len(f) == 3 && f[0] == "0" && f[1] == "0"), nil
}
