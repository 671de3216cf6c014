package zfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/zfs/internal/fusecompat"
)

// The host side of ZFS, shared by arbor serve (Open with a StateDir) and
// the tests (zfstest): zfs-fuse started when ZFS does not answer, the
// zfs-fuse compatibility shim wired in front of go-zfs, and a pool in a
// file. See docs/zfs.md.

// RealZFSEnv names the real zfs binary for the shim: the process that
// wires the shim sets it, and the shim (the same binary started as "zfs")
// reads it.
const RealZFSEnv = "ARBOR_REAL_ZFS"

// MainIfShim serves one zfs command line through the zfs-fuse
// compatibility layer and exits when this process was started under the
// name "zfs" (the symlink PrepareHost puts first in PATH); otherwise it
// returns at once. A binary that opens the zfs backend on zfs-fuse (arbor,
// a test binary through zfstest.Main) calls it first thing.
func MainIfShim() {
	servesShim.Store(true)
	if filepath.Base(os.Args[0]) != "zfs" {
		return
	}
	real := os.Getenv(RealZFSEnv)
	if real == "" {
		fmt.Fprintf(os.Stderr, "zfs shim: %s is not set\n", RealZFSEnv)
		os.Exit(127)
	}
	os.Exit(fusecompat.Main(os.Args[1:], real, os.Stdin, os.Stdout, os.Stderr))
}

// servesShim is set by MainIfShim: only a binary that calls it may be
// wired as the shim (any other, run as zfs, would just run itself).
var servesShim atomic.Bool

// ErrNoZFSFuse is why PrepareHost cannot get a ZFS to answer here: ZFS
// does not answer and there is no zfs-fuse to start.
var ErrNoZFSFuse = errors.New("zfs does not answer and zfs-fuse is not installed")

// Host is what PrepareHost did to this host, for Close to undo.
type Host struct {
	// Started: PrepareHost started the zfs-fuse daemon (or adopted the
	// one an earlier run started with the same folder, whose pid file it
	// found there).
	Started bool
	// Fuse: the zfs found is zfs-fuse's (zfs list lacks -p) and go-zfs
	// is routed through the shim.
	Fuse bool
	pid  int
	log  *slog.Logger
}

// wiring guards wired: the process-wide PATH and RealZFSEnv route zfs
// through the shim.
var (
	wiring sync.Mutex
	wired  bool
)

// PrepareHost makes ZFS usable from this process: it starts zfs-fuse (pid
// file in dir) when `zpool list` does not answer, and when the zfs command
// is zfs-fuse's, puts a symlink dir/bin/zfs to this executable first in
// PATH, so that go-zfs and every zfs call of this package run the
// compatibility shim (MainIfShim must run in main). On OpenZFS it changes
// nothing. The error wraps cr.ErrUnavailable (and ErrNoZFSFuse) when the
// host has no usable ZFS.
func PrepareHost(ctx context.Context, dir string, log *slog.Logger) (*Host, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Host{log: log}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("zfs: not root: %w", cr.ErrUnavailable)
	}
	if _, err := exec.LookPath("zpool"); err != nil {
		return nil, fmt.Errorf("zfs tools not installed (zfs-fuse on this kernel): run make deps: %w", cr.ErrUnavailable)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("zfs: %w", err)
	}
	if err := h.startDaemon(ctx, dir); err != nil {
		return nil, err
	}
	if err := h.wireShim(dir); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// answers reports whether ZFS answers `zpool list`.
func answers(ctx context.Context) bool {
	return exec.CommandContext(ctx, "zpool", "list").Run() == nil
}

// startDaemon starts zfs-fuse when ZFS does not answer. When it does,
// the daemon is adopted as started if dir's pid file names it (an earlier
// run of the same owner, killed before it could stop it).
func (h *Host) startDaemon(ctx context.Context, dir string) error {
	pidFile := filepath.Join(dir, "zfs-fuse.pid")
	if answers(ctx) {
		if pid := readPid(pidFile); pid > 0 && isZFSFuse(pid) {
			h.Started, h.pid = true, pid
			h.log.InfoContext(ctx, "zfs-fuse started by an earlier run is still serving", slog.Int("pid", pid))
		}
		return nil
	}
	if _, err := exec.LookPath("zfs-fuse"); err != nil {
		return fmt.Errorf("%w: run make deps: %w", ErrNoZFSFuse, cr.ErrUnavailable)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("zfs-fuse needs /dev/fuse: %v: %w", err, cr.ErrUnavailable)
	}
	os.Remove(pidFile)
	// zfs-fuse forks its daemon and exits; the daemon does not keep our
	// output open.
	if out, err := exec.CommandContext(ctx, "zfs-fuse", "--pidfile", pidFile, "--no-kstat-mount").CombinedOutput(); err != nil {
		return fmt.Errorf("start zfs-fuse: %v: %s", err, out)
	}
	for range 100 {
		if answers(ctx) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	pid := readPid(pidFile)
	if pid <= 0 {
		return fmt.Errorf("start zfs-fuse: no pid in %s", pidFile)
	}
	h.Started, h.pid = true, pid
	if !answers(ctx) {
		h.Close()
		return fmt.Errorf("zfs-fuse (pid %d) started but zpool list does not answer: %w", pid, cr.ErrUnavailable)
	}
	h.log.InfoContext(ctx, "ZFS did not answer: started zfs-fuse", slog.Int("pid", pid), slog.String("pidfile", pidFile))
	return nil
}

func readPid(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}

func isZFSFuse(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(b)) == "zfs-fuse"
}

// IsFuse reports whether the zfs binary at path is zfs-fuse's: its `zfs
// list` has no -p.
func IsFuse(path string) bool {
	out, err := exec.Command(path, "list", "-Hp", "-o", "name").CombinedOutput()
	return err != nil && strings.Contains(string(out), "invalid option")
}

// wireShim routes the zfs command through the shim when it is zfs-fuse's.
func (h *Host) wireShim(dir string) error {
	wiring.Lock()
	defer wiring.Unlock()
	if wired {
		h.Fuse = true // by an earlier PrepareHost of this process
		return nil
	}
	real, err := exec.LookPath("zfs")
	if err != nil {
		return fmt.Errorf("zfs tools not installed (zfs-fuse on this kernel): run make deps: %w", cr.ErrUnavailable)
	}
	if !IsFuse(real) {
		return nil
	}
	if !servesShim.Load() {
		return fmt.Errorf("zfs is zfs-fuse's and this binary does not serve the compatibility shim (it must call zfs.MainIfShim first in main or TestMain): %w", cr.ErrUnavailable)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("zfs-fuse shim: %w", err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return fmt.Errorf("zfs-fuse shim: %w", err)
	}
	link := filepath.Join(bin, "zfs")
	if t, err := os.Readlink(link); err != nil || t != self {
		os.Remove(link)
		if err := os.Symlink(self, link); err != nil {
			return fmt.Errorf("zfs-fuse shim: %w", err)
		}
	}
	os.Setenv(RealZFSEnv, real)
	os.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	h.Fuse, wired = true, true
	h.log.Info("zfs is zfs-fuse: go-zfs runs through the compatibility shim", slog.String("zfs", link), slog.String("real", real))
	return nil
}

// Close stops the zfs-fuse daemon PrepareHost started, unless a pool
// that is not FAULTED is still imported (another user of the same
// daemon): the daemon is left as it was found. The shim stays wired for the rest of the process.
func (h *Host) Close() {
	if h == nil || !h.Started || h.pid <= 0 {
		return
	}
	if pools := inUse(); len(pools) > 0 {
		h.log.Info("zfs-fuse left running: other pools are imported", slog.Int("pid", h.pid), slog.String("pools", strings.Join(pools, " ")))
		return
	}
	pid := h.pid
	h.Started, h.pid = false, 0
	// zfs-fuse syncs its pools before it exits, which took over 5 s
	// under load once; one that does not stop in 15 s is killed, so that
	// the next user never meets it.
	stopped := func(d time.Duration) bool {
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if syscall.Kill(pid, 0) != nil {
				return true
			}
		}
		return false
	}
	syscall.Kill(pid, syscall.SIGTERM)
	if stopped(15 * time.Second) {
		h.log.Info("stopped zfs-fuse", slog.Int("pid", pid))
		return
	}
	syscall.Kill(pid, syscall.SIGKILL)
	if stopped(5 * time.Second) {
		h.log.Warn("zfs-fuse did not stop within 15 s of SIGTERM: killed", slog.Int("pid", pid))
		return
	}
	h.log.Warn("zfs-fuse did not stop, even after SIGKILL", slog.Int("pid", pid))
}

// inUse lists the imported pools that are not FAULTED or UNAVAIL:
// zfs-fuse imports every pool of its cache when it starts, also those
// whose files are gone (one made before CreatePool kept its pools out of
// the cache), and those use nothing. When zpool cannot tell (a daemon
// too busy to answer), it answers that one is: stopping a daemon another
// process still uses breaks that process, leaving an idle one running
// costs nothing.
func inUse() []string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "zpool", "list", "-H", "-o", "name,health").Output()
	if err != nil {
		return []string{fmt.Sprintf("(unknown: zpool list: %v)", err)}
	}
	var pools []string
	for l := range strings.Lines(string(out)) {
		f := strings.Fields(l)
		if len(f) == 2 && f[1] != "FAULTED" && f[1] != "UNAVAIL" {
			pools = append(pools, f[0])
		}
	}
	return pools
}

// CreatePool makes a pool called name in a new sparse file of size bytes,
// its root dataset mounted at mountpoint. The pool is kept out of the
// daemon's pool cache (cachefile=none): whoever uses it imports it by its
// file (ownPool), and a pool left behind by a killed run (a test's, in a
// temporary folder) is not imported again by every later start of
// zfs-fuse.
func CreatePool(ctx context.Context, name, file string, size int64, mountpoint string) (err error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("zfs pool file: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(file)
		}
	}()
	if err = f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("zfs pool file: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("zfs pool file: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "zpool", "create", "-o", "cachefile=none", "-m", mountpoint, name, file).CombinedOutput(); err != nil {
		return fmt.Errorf("zpool create %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	return nil
}

// DefaultPoolSize is the size of a new pool file when Options.PoolSize is 0.
const DefaultPoolSize = 16 << 30

// Layout of the own pool below Options.StateDir: the folder (pool file,
// zfs-fuse pid file, shim), the pool file and the mountpoint.
const (
	stateSub = "zfs"
	poolFile = "pool.img"
	poolMnt  = "mnt"
	rootName = "arbor"
)

// PoolName is the name of the pool Open makes in stateDir: "arbor" and a
// hash of the state dir's absolute path, so that state dirs do not share
// pools and a restart finds its own.
func PoolName(stateDir string) (string, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(abs))
	return "arbor" + hex.EncodeToString(sum[:5]), nil
}

// imported reports whether pool name is imported.
func imported(ctx context.Context, name string) bool {
	return exec.CommandContext(ctx, "zpool", "list", "-H", "-o", "name", name).Run() == nil
}

// ownPool makes or imports the pool in dir (dir/pool.img, mounted at
// dir/mnt) and returns its name.
func ownPool(ctx context.Context, stateDir, dir string, size int64, log *slog.Logger) (string, error) {
	name, err := PoolName(stateDir)
	if err != nil {
		return "", err
	}
	if imported(ctx, name) {
		log.InfoContext(ctx, "reuse imported zfs pool", slog.String("pool", name))
		return name, nil
	}
	file := filepath.Join(dir, poolFile)
	if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
		if size <= 0 {
			size = DefaultPoolSize
		}
		if err := CreatePool(ctx, name, file, size, filepath.Join(dir, poolMnt)); err != nil {
			return "", err
		}
		log.InfoContext(ctx, "made zfs pool file", slog.String("pool", name), slog.String("path", file), slog.Int64("size", size))
		return name, nil
	} else if err != nil {
		return "", err
	}
	if out, err := exec.CommandContext(ctx, "zpool", "import", "-o", "cachefile=none", "-d", dir, name).CombinedOutput(); err != nil {
		return "", fmt.Errorf("zpool import -d %s %s: %v: %s", dir, name, err, bytes.TrimSpace(out))
	}
	log.InfoContext(ctx, "imported zfs pool", slog.String("pool", name), slog.String("path", file))
	return name, nil
}

// exportPool exports pool name (see poolBusyRetry).
func exportPool(ctx context.Context, name string) error {
	return poolBusyRetry(ctx, "export", name)
}

// DestroyPool destroys pool name and everything in it (see
// poolBusyRetry); for tests, whose pools are temporary.
func DestroyPool(ctx context.Context, name string) error {
	exec.CommandContext(ctx, "zfs", "umount", name).Run()
	return poolBusyRetry(ctx, "destroy", "-f", name)
}

// poolBusyRetry runs `zpool args...`, retrying for up to about five
// seconds while zfs-fuse calls the pool busy: it does for a moment after
// its datasets were unmounted (as in destroyMounted).
func poolBusyRetry(ctx context.Context, args ...string) error {
	for try := 0; ; try++ {
		out, err := exec.CommandContext(ctx, "zpool", args...).CombinedOutput()
		if err == nil {
			return nil
		}
		if try == 50 || !strings.Contains(string(out), "busy") || ctx.Err() != nil {
			return fmt.Errorf("zpool %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Unmount undoes what Open did to the host for its StateDir: it exports
// the pool Open made or imported (the datasets stay in the pool file) and
// stops the zfs-fuse daemon Open started (see Host.Close). It is for
// shutdown; nothing may use the snapshotter after it. With a given
// Dataset it only does the latter.
func (s *Snapshotter) Unmount(ctx context.Context) error {
	var err error
	if s.pool != "" {
		if err = exportPool(ctx, s.pool); err == nil {
			s.log.InfoContext(ctx, "exported zfs pool", slog.String("pool", s.pool))
			s.pool = ""
		}
	}
	s.host.Close()
	s.host = nil
	return err
}
