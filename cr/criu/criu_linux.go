package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/arbor-env/arbor/cr/imgdelta"
	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/internal/criubin"
	"github.com/arbor-env/arbor/internal/netns"
)

// Checkpointer runs CRIU.
type Checkpointer struct {
	path string
	log  *slog.Logger
	// NetworkLock is how CRIU locks the sandbox's network during a dump:
	// "skip" (default: a sandbox's net namespace holds only loopback, and
	// every socket's peer is frozen in the same tree) or "nftables".
	NetworkLock string
	// Timeout bounds each CRIU run (a dump, a restore); a run still going
	// then is killed and fails with ErrTimeout. Zero is DefaultTimeout.
	// Set it before the first run.
	Timeout time.Duration
	// FaultHook, when set, is called on each notification CRIU sends
	// during a run (stage "pre-dump", "network-lock", "post-dump",
	// "setup-namespaces", ...) with that CRIU's pid, before it is
	// answered: tests use it to make a run hang (SIGSTOP the CRIU).
	FaultHook func(stage string, criuPID int)
	// LazyFaultHook, when set, is called as FaultHook is during a lazy
	// restore, with its lazy-pages daemon: tests kill the daemon with it.
	LazyFaultHook func(stage string, daemon *LazyPages)
	// GhostLimit is the largest deleted file a process may hold open for
	// a dump to succeed (CRIU copies it into the image); zero is
	// DefaultGhostLimit. A dump that fails on a larger one fails with
	// cr.ErrAgentState, naming the file. Set it before the first run.
	GhostLimit int64
	spares     *spares
}

// DefaultTimeout bounds a CRIU run when Checkpointer.Timeout is zero: a
// dump or restore takes 0.1-0.3 s here, and even a tree of several GB is
// written to tmpfs well within it.
const DefaultTimeout = 2 * time.Minute

// version asks the CRIU at path for its version: major*10000 +
// minor*100 + sublevel.
func version(path string) (int, error) {
	w, err := startSwrk(path)
	if err != nil {
		return 0, err
	}
	defer w.close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := w.call(ctx, &rpc.CriuReq{Type: rpc.CriuReqType_VERSION.Enum()}, nil)
	if err != nil {
		return 0, err
	}
	v := resp.GetVersion()
	return int(v.GetMajorNumber()*10000 + v.GetMinorNumber()*100 + v.GetSublevel()), nil
}

// New resolves the CRIU binary (flag, else the private CRIU 4.x, else PATH)
// and checks its version; a missing or too old CRIU is a wrapped
// cr.ErrUnavailable.
func New(flag string, log *slog.Logger) (*Checkpointer, error) {
	p, err := criubin.Path(flag)
	if err != nil {
		return nil, fmt.Errorf("%w: %v (run make deps)", cr.ErrUnavailable, err)
	}
	v, err := version(p)
	if err != nil {
		return nil, fmt.Errorf("%w: criu %s: %v", cr.ErrUnavailable, p, err)
	}
	if v < criubin.MinMajor*10000+criubin.MinMinor*100 {
		return nil, fmt.Errorf("%w: criu %s is version %d, need %d.%d or newer (run make deps)", cr.ErrUnavailable, p, v, criubin.MinMajor, criubin.MinMinor)
	}
	if log == nil {
		log = slog.Default()
	}
	if err := ensureKdatCache(p); err != nil {
		log.Warn("criu kernel cache unavailable; every CRIU run probes the kernel again", slog.Any("err", err))
	}
	n := 1
	if os.Getenv("ARBOR_CRIU_SPARES") == "0" {
		n = 0 // start CRIU on demand only (for comparisons)
	}
	return &Checkpointer{path: p, log: log, NetworkLock: "skip", spares: newSpares(n)}, nil
}

// ghostLimit is GhostLimit or its default, within what CRIU's option
// holds (32 bits).
func (c *Checkpointer) ghostLimit() int64 {
	if c.GhostLimit <= 0 {
		return DefaultGhostLimit
	}
	return min(c.GhostLimit, 1<<32-1)
}

// Path is the CRIU binary in use.
func (c *Checkpointer) Path() string { return c.path }

func (c *Checkpointer) lock() *rpc.CriuNetworkLockMethod {
	if c.NetworkLock == "nftables" {
		return rpc.CriuNetworkLockMethod_NFTABLES.Enum()
	}
	return rpc.CriuNetworkLockMethod_SKIP.Enum()
}

// DumpRequest says what to dump where.
type DumpRequest struct {
	// PID is the host pid of the tree's root (the sandbox's init).
	PID int
	// Dir receives the images; it must exist and be empty.
	Dir string
	// FreezeCgroup, when set, is the cgroup CRIU freezes the tree with.
	// A tree the caller already froze stays frozen after the dump, also
	// after a dump that failed or was killed (ErrTimeout): the caller
	// thaws it, as the engine does.
	FreezeCgroup string
	// UserNS: the tree has its own user namespace (sandbox user namespace
	// mode). Its network namespace, owned by the host's, is then not named
	// external: CRIU runs inside it, so it is not in the images at all.
	UserNS bool
	// Root is the host path of the tree's root. With it, a removed file a
	// process holds that another name still links is dumped (a link
	// remap, linkremap_linux.go); without it such a dump fails.
	Root string
}

// DumpStats are CRIU's own figures for one dump.
type DumpStats struct {
	Duration     time.Duration
	FrozenTime   time.Duration
	PagesWritten uint64
	Bytes        int64 // size of the image directory
}

// Dump checkpoints the tree and leaves it running.
func (c *Checkpointer) Dump(ctx context.Context, r DumpRequest) (DumpStats, error) {
	start := time.Now()
	dir, err := os.Open(r.Dir)
	if err != nil {
		return DumpStats{}, fmt.Errorf("open image dir: %w", err)
	}
	defer dir.Close()
	// A connection still being set up (SYN sent, or received and not yet
	// accepted) cannot be dumped: it is skipped (TcpSkipInFlight), and its
	// connect fails after a restore as after a lost packet, instead of the
	// whole dump failing. A held deleted file up to the ghost limit is
	// copied into the image; a larger one is the agent's failure
	// (agentstate.go).
	opts := &rpc.CriuOpts{
		Pid:               proto.Int32(int32(r.PID)),
		ImagesDirFd:       proto.Int32(int32(dir.Fd())),
		LogFile:           proto.String("dump.log"),
		LogLevel:          proto.Int32(logLevel()),
		LeaveRunning:      proto.Bool(true),
		TcpEstablished:    proto.Bool(true),
		TcpSkipInFlight:   proto.Bool(true),
		FileLocks:         proto.Bool(true),
		GhostLimit:        proto.Uint32(uint32(c.ghostLimit())),
		ManageCgroupsMode: rpc.CriuCgMode_IGNORE.Enum(),
		NetworkLock:       c.lock(),
	}
	if r.FreezeCgroup != "" {
		opts.FreezeCgroup = proto.String(r.FreezeCgroup)
	}
	// What CRIU leaves out but Arbor can set again is recorded with the
	// images at post-dump, while CRIU still holds the tree stopped: the
	// tasks recorded are the tasks dumped (a tree that is not frozen
	// before the dump forks and reaps meanwhile; procattrs_linux.go).
	opts.NotifyScripts = proto.Bool(true)
	if r.Root != "" {
		opts.LinkRemap = proto.Bool(true)
	}
	onNotify := func(m *rpc.CriuNotify) error {
		if m.GetScript() != "post-dump" {
			return nil
		}
		if r.Root != "" {
			// CRIU removes its link remaps after this, as the tree
			// keeps running.
			if err := recordLinks(r.Dir, r.Root); err != nil {
				return err
			}
		}
		tasks, err := treeTasks(r.PID)
		if err != nil {
			return err
		}
		return recordAttrs(r.Dir, tasks)
	}
	// What no restore brings back refuses the dump (unrestorable_linux.go).
	tasks, err := treeTasks(r.PID)
	if err != nil {
		return DumpStats{}, fmt.Errorf("criu dump of pid %d: %w", r.PID, err)
	}
	if err := refuseUnrestorable(r.PID, tasks); err != nil {
		return DumpStats{}, fmt.Errorf("criu dump of pid %d: %w", r.PID, err)
	}
	var sp *spare
	if r.UserNS {
		sp, err = c.dumpInNetns(r.PID)
	} else {
		var ino uint64
		if ino, err = netnsInode(r.PID); err != nil {
			return DumpStats{}, err
		}
		opts.External = []string{fmt.Sprintf("net[%d]:%s", ino, netKey)}
		sp, err = c.take(false)
	}
	if err != nil {
		return DumpStats{}, err
	}
	defer c.closeSpare(sp)
	if err := c.run(ctx, sp, rpc.CriuReqType_DUMP, opts, onNotify); err != nil {
		if aerr := agentDumpError(r.Dir, c.ghostLimit()); aerr != nil {
			return DumpStats{}, fmt.Errorf("criu dump of pid %d: %w", r.PID, aerr)
		}
		return DumpStats{}, fmt.Errorf("criu dump of pid %d: %w%s", r.PID, err, logTail(r.Dir, "dump.log"))
	}
	st := DumpStats{Duration: time.Since(start)}
	if ds, err := crit.GetDumpStats(r.Dir); err == nil {
		st.FrozenTime = time.Duration(ds.GetFrozenTime()) * time.Microsecond
		st.PagesWritten = ds.GetPagesWritten()
	}
	st.Bytes, _ = dirSize(r.Dir)
	return st, nil
}

// DumpForCompare dumps the tree into r.Dir as Dump does and leaves it
// running, for a comparison of its images with another tree's
// (cr/imgcompare): the same options (namespaces, external network,
// cgroups ignored, link remaps, the freeze cgroup), so that two dumps
// differ only where the trees do. CRIU has no dump without memory; the
// comparison leaves the pages out.
func (c *Checkpointer) DumpForCompare(ctx context.Context, r DumpRequest) error {
	_, err := c.Dump(ctx, r)
	return err
}

// RestoreRequest says what to restore where.
type RestoreRequest struct {
	// Dir holds the images of a Dump.
	Dir string
	// Root is the new root file system (a writable clone of the
	// snapshot taken with the dump); CRIU needs it to be a mount point
	// and Restore bind-mounts it onto itself when it is not.
	Root string
	// WorkDir receives the restore log; it defaults to a fresh temporary
	// directory (images may be shared read-only by parallel restores).
	WorkDir string
	// Join, when set, is called with the pid of the restored root task
	// before it forks the rest of the tree (to place it in cgroups).
	Join func(pid int) error
	// UserNS: the images are of a tree in its own user namespace
	// (DumpRequest.UserNS); the tree inherits CRIU's fresh network
	// namespace, opened up for unprivileged ids as at the start.
	UserNS bool
}

// notify answers a restore's notifications: it places the root task
// (setup-namespaces), learns its pid and gives the stopped tree what CRIU
// does not restore (post-restore).
type notify struct {
	join   func(int) error
	pid    int
	dir    string     // the images, with their attrsFile
	ghosts *ghostPlan // swapped in at post-restore (ghostdir_linux.go)
}

func (n *notify) handle(m *rpc.CriuNotify) error {
	switch m.GetScript() {
	case "setup-namespaces":
		if n.join != nil {
			return n.join(int(m.GetPid()))
		}
	case "post-restore":
		n.pid = int(m.GetPid())
		// The tree is restored and stopped: it gets the attributes
		// recorded at the dump (or the restore fails), and CRIU
		// removes its ghosts next.
		if err := applyAttrs(n.dir, n.pid); err != nil {
			return err
		}
		return n.ghosts.swap()
	}
	return nil
}

// Restore brings the tree back as a child of this process (RstSibling) and
// returns the host pid of its root.
func (c *Checkpointer) Restore(ctx context.Context, r RestoreRequest) (int, error) {
	return c.restore(ctx, r, nil)
}

// RestoreLazily restores the tree as Restore does, but with its private
// anonymous memory left in the images for daemon, a lazy-pages daemon
// StartLazyPages started on r.Dir: it copies each page in on first touch
// and the rest in the background, then exits (docs/engine.md, "Lazy
// restore"). The restore works in the daemon's work directory
// (r.WorkDir is not used). The caller keeps daemon: it Closes it after a
// failed restore, and after a successful one once the tree is gone; the
// images in r.Dir must stay until the daemon is Done. When the daemon
// fails (Done with an error) the tree may have lost memory and must be
// killed. A daemon that fails before the restore returns fails it with
// ErrLazyPages.
func (c *Checkpointer) RestoreLazily(ctx context.Context, r RestoreRequest, daemon *LazyPages) (int, error) {
	if daemon == nil {
		return 0, fmt.Errorf("%w: lazy restore without a daemon", ErrLazyPages)
	}
	return c.restore(ctx, r, daemon)
}

func (c *Checkpointer) restore(ctx context.Context, r RestoreRequest, daemon *LazyPages) (pid int, err error) {
	if r.UserNS {
		// The root task reads its images as the user namespace's root,
		// which cannot follow a delta image's parent link through the
		// image store's 0700 directory (allowSearch): it restores from
		// a whole copy beside it. A lazy daemon reads the delta itself;
		// the copy's pages from the parent are not lazy, as in the
		// delta (docs/engine.md, "Delta images").
		flat, done, err := imgdelta.FlatCopy(r.Dir)
		if err != nil {
			return 0, fmt.Errorf("flatten delta image: %w", err)
		}
		defer done()
		r.Dir = flat
	}
	dir, err := os.Open(r.Dir)
	if err != nil {
		return 0, fmt.Errorf("open image dir: %w", err)
	}
	defer dir.Close()
	work := r.WorkDir
	if daemon != nil {
		// The restore finds the daemon's socket in its work directory.
		work = daemon.work
	} else if work == "" {
		if work, err = os.MkdirTemp("", "arbor-restore-"); err != nil {
			return 0, err
		}
		defer os.RemoveAll(work)
	}
	wd, err := os.Open(work)
	if err != nil {
		return 0, fmt.Errorf("open work dir: %w", err)
	}
	defer wd.Close()
	sp, err := c.take(true)
	if err != nil {
		return 0, err
	}
	defer c.closeSpare(sp)
	if r.UserNS {
		if err := netns.Do(sp.netns, netns.AllowUnprivileged); err != nil {
			return 0, err
		}
		if err := allowSearch(dir); err != nil {
			return 0, err
		}
	}
	// A deleted directory a process holds, with something new at its
	// path, is made under a hidden name and swapped in at post-restore
	// (ghostdir_linux.go).
	ghosts, err := planGhosts(r.Dir, r.Root)
	if err != nil {
		return 0, fmt.Errorf("plan the images' deleted directories: %w", err)
	}
	defer ghosts.close()
	if ghosts.dir != r.Dir {
		if dir, err = os.Open(ghosts.dir); err != nil {
			return 0, err
		}
		defer dir.Close()
		if r.UserNS {
			if err := allowSearch(dir); err != nil {
				return 0, err
			}
		}
	}
	// A removed file linked elsewhere is opened by a name made now
	// (linkremap_linux.go).
	links, err := placeLinks(r.Dir, r.Root)
	if err != nil {
		return 0, err
	}
	defer unplaceLinks(links)
	n := &notify{join: r.Join, dir: r.Dir, ghosts: ghosts}
	opts := &rpc.CriuOpts{
		ImagesDirFd:       proto.Int32(int32(dir.Fd())),
		WorkDirFd:         proto.Int32(int32(wd.Fd())),
		LogFile:           proto.String("restore.log"),
		LogLevel:          proto.Int32(logLevel()),
		Root:              proto.String(r.Root),
		RstSibling:        proto.Bool(true),
		TcpEstablished:    proto.Bool(true),
		FileLocks:         proto.Bool(true),
		ManageCgroupsMode: rpc.CriuCgMode_IGNORE.Enum(),
		NetworkLock:       c.lock(),
		NotifyScripts:     proto.Bool(true),
		InheritFd:         []*rpc.InheritFd{{Key: proto.String(netKey), Fd: proto.Int32(netnsFd)}},
	}
	handle := n.handle
	if daemon != nil {
		opts.LazyPages = proto.Bool(true)
		if hook := c.LazyFaultHook; hook != nil {
			handle = func(m *rpc.CriuNotify) error {
				hook(m.GetScript(), daemon)
				return n.handle(m)
			}
		}
	}
	if daemon != nil {
		// A daemon that fails while CRIU restores ends the restore at
		// once: CRIU's own way out of a failed restore after it seized
		// the tree waits for the root task, which waits for its
		// children, which wait for CRIU (their tracer) to reap them,
		// until CRIU's deadline (TestLazyDaemonKilled).
		ran := make(chan struct{})
		defer close(ran)
		go func() {
			select {
			case <-daemon.done:
				if daemon.err != nil {
					sp.w.kill()
				}
			case <-ran:
			}
		}()
	}
	if err := c.run(ctx, sp, rpc.CriuReqType_RESTORE, opts, handle); err != nil {
		if daemon != nil && daemon.Err() != nil {
			err = daemon.Err()
		}
		if aerr := agentRestoreError(work); aerr != nil {
			return 0, fmt.Errorf("criu restore into %s: %w%s", r.Root, aerr, logTail(work, "restore.log"))
		}
		return 0, fmt.Errorf("criu restore into %s: %w%s", r.Root, err, logTail(work, "restore.log"))
	}
	if n.pid == 0 {
		return 0, errors.New("criu restore reported no pid")
	}
	// What nothing sets from outside is compared once CRIU is done
	// (procattrs_linux.go); the caller has not handed the tree out.
	if err := checkFixed(r.Dir, n.pid); err != nil {
		return 0, fmt.Errorf("criu restore into %s: %w", r.Root, err)
	}
	if daemon != nil {
		// Every uffd reached the daemon during the restore; one that is
		// gone already cannot serve them.
		if err := daemon.Err(); err != nil {
			return 0, fmt.Errorf("criu restore into %s: %w", r.Root, err)
		}
	}
	return n.pid, nil
}

// logLevel is CRIU's log verbosity: 2 (errors and warnings) unless
// ARBOR_CRIU_LOG_LEVEL asks for more when debugging.
func logLevel() int32 {
	if v, err := strconv.Atoi(os.Getenv("ARBOR_CRIU_LOG_LEVEL")); err == nil && v >= 0 && v <= 4 {
		return int32(v)
	}
	return 2
}

// run sends sp's CRIU one request, unless ctx has already ended. A run
// the caller gives up on is not abandoned half-way (a dump left behind
// would leave the tree frozen, a restore processes nobody tracks), but
// none outlives c.Timeout: then its CRIU is killed and run returns an
// error wrapping ErrTimeout. The caller undoes what the run left (thaws
// the tree, destroys the restored sandbox's cgroup).
func (c *Checkpointer) run(ctx context.Context, sp *spare, typ rpc.CriuReqType, opts *rpc.CriuOpts, onNotify func(*rpc.CriuNotify) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d := c.Timeout
	if d <= 0 {
		d = DefaultTimeout
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	if hook := c.FaultHook; hook != nil {
		next := onNotify
		onNotify = func(m *rpc.CriuNotify) error {
			hook(m.GetScript(), sp.w.pid())
			if next != nil {
				return next(m)
			}
			return nil
		}
	}
	if onNotify != nil {
		opts.NotifyScripts = proto.Bool(true)
	}
	_, err := sp.w.call(rctx, &rpc.CriuReq{Type: typ.Enum(), Opts: opts}, onNotify)
	return err
}

// logTail returns the last error lines of a CRIU log, for error messages.
func logTail(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	var keep []string
	for _, l := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(l, []byte("Error")) || bytes.Contains(l, []byte("rror (")) {
			keep = append(keep, string(l))
		}
	}
	if len(keep) > 6 {
		keep = keep[len(keep)-6:]
	}
	if len(keep) == 0 {
		return ""
	}
	return "\n" + strings.Join(keep, "\n")
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n, err
}
