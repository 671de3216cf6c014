package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/internal/netns"
	"github.com/arbor-env/arbor/sandbox/ctl"
	"github.com/arbor-env/arbor/sandbox/initd"
)

// prepareUserNSRoot readies a shifted root for a sandbox in its own user
// namespace: stage one cannot mknod there, so /dev's nodes are made from the
// host now (they are files of the root and so part of its snapshots), and
// what the host wrote into the root (/.arbor, the init binary, the nodes) is
// given to the range's root, which could not even enter /.arbor otherwise.
func prepareUserNSRoot(root string, u UserNSConfig) error {
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return fmt.Errorf("stat root: %w", err)
	}
	if !u.contains(st.Uid) || !u.contains(st.Gid) {
		return fmt.Errorf("%w: root %s is owned by %d:%d, not by the range %s (use a shifted image)", ErrUnshiftedRoot, root, st.Uid, st.Gid, u)
	}
	// The host makes and chowns files below these: a symlink there (an
	// imported image can hold anything) would point that at host files.
	for _, d := range []string{"dev", ctl.Dir} {
		if err := unix.Lstat(filepath.Join(root, d), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return fmt.Errorf("%w: /%s of root %s is a symlink", ErrBadRoot, d, root)
		}
	}
	if err := initd.PrepareDev(root); err != nil {
		return err
	}
	paths := []string{filepath.Join(root, ctl.Dir), filepath.Join(root, ctl.InitPath), filepath.Join(root, "dev")}
	devs, err := os.ReadDir(filepath.Join(root, "dev"))
	if err != nil {
		return fmt.Errorf("read /dev: %w", err)
	}
	for _, d := range devs {
		paths = append(paths, filepath.Join(root, "dev", d.Name()))
	}
	for _, p := range paths {
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if u.contains(st.Uid) && u.contains(st.Gid) {
			continue
		}
		if err := unix.Lchown(p, int(u.HostID), int(u.HostID)); err != nil {
			return fmt.Errorf("chown %s: %w", p, err)
		}
	}
	return nil
}

func (u UserNSConfig) contains(id uint32) bool {
	return id >= u.HostID && id-u.HostID < u.Size
}

// userNSStart is what Start needs in user namespace mode: the network
// namespace to start init in and the capabilities to hand over. A nil one
// (the mode is off) changes nothing.
type userNSStart struct {
	u       UserNSConfig
	netns   *os.File
	ambient []uintptr
}

// prepareUserNS readies a start in user namespace mode (nil when the mode
// is off): the root (prepareUserNSRoot), the network namespace
// (userNSNetns) and the capabilities to hand over (apply).
func prepareUserNS(root string, u UserNSConfig) (*userNSStart, error) {
	if !u.Enabled {
		return nil, nil
	}
	if err := prepareUserNSRoot(root, u); err != nil {
		return nil, err
	}
	last, err := lastCap()
	if err != nil {
		return nil, err
	}
	s := &userNSStart{u: u}
	for c := 0; c <= last; c++ {
		s.ambient = append(s.ambient, uintptr(c))
	}
	if s.netns, err = userNSNetns(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *userNSStart) close() {
	if s != nil {
		s.netns.Close()
	}
}

// apply adds the user namespace and its id maps to the clone of stage one.
// Stage one runs as host root, which is unmapped inside: so it can still
// reach the root through host directories only root may enter (a state dir
// of mode 0700). Its capabilities in the new namespace would not survive
// the exec of a non-root (in the namespace) process, so they are passed as
// ambient capabilities; it becomes the namespace's root after pivot_root
// and clears them (initd.becomeNSRoot). The network namespace is made
// beforehand (userNSNetns), owned by the host's user namespace: CRIU
// cannot put a restored tree with its own user namespace into a prepared
// network namespace it does not own, so restores and starts both use one
// the host owns.
func (s *userNSStart) apply(a *syscall.SysProcAttr) {
	if s == nil {
		return
	}
	a.Cloneflags = a.Cloneflags&^syscall.CLONE_NEWNET | syscall.CLONE_NEWUSER
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(s.u.HostID), Size: int(s.u.Size)}}
	a.UidMappings, a.GidMappings = m, m
	// Root inside may change its groups, as in a container.
	a.GidMappingsEnableSetgroups = true
	a.AmbientCaps = s.ambient
}

// start starts stage one, inside the prepared network namespace.
func (s *userNSStart) start(cmd *exec.Cmd) error {
	if s == nil {
		return cmd.Start()
	}
	return netns.Do(s.netns, cmd.Start)
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read cap_last_cap: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("parse cap_last_cap: %w", err)
	}
	return n, nil
}

// userNSNetns makes the network namespace a sandbox in user namespace mode
// is started in. The host's user namespace owns it, as it owns the fresh
// namespaces restores get (cr/criu), so a started sandbox and a restored
// one are alike: loopback up, no capability over the namespace, low ports
// and ICMP echo open to every id.
func userNSNetns() (*os.File, error) {
	ns, err := netns.NewLoopback()
	if err != nil {
		return nil, err
	}
	if err := netns.Do(ns, netns.AllowUnprivileged); err != nil {
		ns.Close()
		return nil, err
	}
	return ns, nil
}

// UserNSOfRoot tells the mode a root file system was made for from the
// owner of its top directory, which is root inside: host root for the
// normal mode, the first id of the range for user namespace mode (size
// ids, DefaultUserNSSize when zero). Restores use it, so that a state is
// brought back in the mode it was made in.
func UserNSOfRoot(root string, size uint32) (UserNSConfig, error) {
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return UserNSConfig{}, fmt.Errorf("stat root: %w", err)
	}
	if st.Uid == 0 && st.Gid == 0 {
		return UserNSConfig{}, nil
	}
	if st.Uid != st.Gid {
		return UserNSConfig{}, fmt.Errorf("%w: root %s is owned by %d:%d, neither host root nor the start of a range", ErrUnshiftedRoot, root, st.Uid, st.Gid)
	}
	return UserNSConfig{Enabled: true, HostID: st.Uid, Size: size}.WithDefaults(), nil
}

// checkUIDMap refuses a sandbox whose init does not have the uid and gid
// maps its mode asks for: a child restored from a state, or a started one,
// must never run with weaker (or other) ids than its mode promises.
func checkUIDMap(pid int, u UserNSConfig) error {
	want := "0 0 4294967295"
	if u.Enabled {
		want = u.UIDMap()
	}
	for _, f := range []string{"uid_map", "gid_map"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err != nil {
			return fmt.Errorf("read %s of init: %w", f, err)
		}
		if got := strings.Join(strings.Fields(string(b)), " "); got != want {
			return fmt.Errorf("%w: init's %s is %q, want %q", ErrUIDMap, f, got, want)
		}
	}
	return nil
}
