package criu

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// netKey names the sandbox's network namespace as an external resource in
// dumps: it is not archived (a sandbox's namespace holds only loopback), and
// every restore gets a fresh loopback namespace instead. Archiving it would
// run ip and iptables-save several times per dump (~170 ms here).
const netKey = "arbor-netns"

// netnsInode returns the inode of pid's network namespace.
func netnsInode(pid int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		return 0, fmt.Errorf("stat net namespace of %d: %w", pid, err)
	}
	return st.Ino, nil
}

// dumpInNetns starts a CRIU inside the network namespace of pid, for a
// tree in its own user namespace (DumpRequest.UserNS).
func (c *Checkpointer) dumpInNetns(pid int) (*spare, error) {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, fmt.Errorf("open net namespace of %d: %w", pid, err)
	}
	defer ns.Close()
	w, err := c.startIn(ns)
	if err != nil {
		return nil, err
	}
	return &spare{w: w}, nil
}

// allowSearch lets every id search the image directory d. In a restore of
// a tree with its own user namespace the root task, already in that
// namespace, opens images relative to d, and host root's 0700 directory is
// closed to it (it has no capabilities over files of unmapped owners). The
// files are still only readable through d, whose parents the engine keeps
// at 0700 (cr/imgcache), and hold nothing the restored tree does not get
// anyway.
func allowSearch(d *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return fmt.Errorf("stat image dir: %w", err)
	}
	if st.Mode&0o001 != 0 {
		return nil
	}
	if err := unix.Fchmod(int(d.Fd()), st.Mode&0o7777|0o001); err != nil {
		return fmt.Errorf("open image dir to the user namespace: %w", err)
	}
	return nil
}
