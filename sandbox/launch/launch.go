package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// VolumePrefix is where sandbox roots live in the snapshotter.
const VolumePrefix = "sandboxes/"

// Launcher boots environments from images.
type Launcher struct {
	Snap   cr.Snapshotter
	Images *image.Store
	// InitBinary is the static arbor-init; sandbox.FindInit when empty.
	InitBinary string
	Limits     sandbox.Limits
	// Isolation is the hardening of every sandbox launched (and the policy
	// restored ones are checked against); a launch's Options.Caps
	// replaces its Caps.
	Isolation sandbox.Isolation
	Logger    *slog.Logger
	// AutoBuild lets Launch build a missing image that has a built-in
	// recipe (busybox, debian), and pull an image named by a registry
	// reference the store lacks (image.Store.Resolve), writing progress
	// to Progress.
	AutoBuild bool
	Progress  io.Writer
	// Recipes is a folder of image recipe files (docs/images.md,
	// "Recipes"): with AutoBuild, an image NAME that DIR/NAME.yaml
	// describes is built from it on its first launch, and built again
	// when the recipe, its files or its base changed (BuildRecipe; an
	// up-to-date image costs a hash of the recipe's files).
	Recipes string
	// UserNS starts sandboxes in user namespace mode, on copies of the
	// images shifted to its range (image.Store.Shifted).
	UserNS sandbox.UserNSConfig
}

// resolve finds image name: from its recipe in l.Recipes when there is
// one, else in the store (pulling a registry reference with AutoBuild).
func (l *Launcher) resolve(ctx context.Context, name string) (image.Info, error) {
	if p := l.recipe(name); p != "" {
		in, err := l.Images.BuildRecipe(ctx, name, p, l.Progress)
		if !errors.Is(err, image.ErrExists) {
			return in, err
		}
		// An image of that name that no recipe made: it is used as it is.
	}
	return l.Images.Resolve(ctx, name, l.AutoBuild, l.Progress)
}

// recipe is the recipe file of image name in l.Recipes, or "".
func (l *Launcher) recipe(name string) string {
	if !l.AutoBuild || l.Recipes == "" || slices.Contains(image.Recipes, name) || image.IsReference(name) || image.ValidName(name) != nil {
		return ""
	}
	p := filepath.Join(l.Recipes, name+".yaml")
	if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
		return ""
	}
	return p
}

// Env is a running sandbox plus the volume that is its root.
type Env struct {
	ID string
	// Image is the local name of the image it was launched from: for a
	// registry reference the digest-pinned name it resolved to
	// (image.DigestName), so a lineage never follows a moving tag.
	Image   string
	Volume  string
	Sandbox *sandbox.Sandbox
	snap    cr.Snapshotter
}

// Options tune one launch.
type Options struct {
	// Caps, when set, is the capability set the sandbox keeps (a task's
	// caps:); see sandbox.Isolation.Caps.
	Caps []string
}

// Launch clones image and boots a sandbox on the clone. On failure nothing
// is left behind.
func (l *Launcher) Launch(ctx context.Context, imageName string) (*Env, error) {
	return l.LaunchWith(ctx, imageName, Options{})
}

// LaunchWith is Launch with per-launch options.
func (l *Launcher) LaunchWith(ctx context.Context, imageName string, o Options) (env *Env, err error) {
	log := l.Logger
	if log == nil {
		log = slog.Default()
	}
	img, err := l.resolve(ctx, imageName)
	if errors.Is(err, image.ErrNotFound) && l.AutoBuild && slices.Contains(image.Recipes, imageName) {
		// Ensure: concurrent first launches of an image share one build.
		log.Info("building missing image", slog.String("image", imageName))
		if img, err = l.Images.Ensure(ctx, imageName, l.Progress); err != nil {
			return nil, fmt.Errorf("build image %s: %w", imageName, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("launch %s: %w", imageName, err)
	}
	imageName = img.Name
	u := l.UserNS.WithDefaults()
	if shell := ShellConfig(img.Config); !u.Enabled && (shell.UID|shell.GID != 0 || img.Config.OtherUsers()) && !canDumpOtherUsers() {
		// CRIU reads each task's resource limits (prlimit), which for a
		// task of another uid needs CAP_SYS_RESOURCE; this host's root
		// lacks it, so a non-root image user's shell, or a daemon of an
		// image labelled as running other users (image.LabelOtherUsers),
		// could never be checkpointed with host ids. In user namespace
		// mode the server owns the sandbox's namespace and may
		// (docs/images.md).
		u = sandbox.UserNSConfig{Enabled: true, Size: l.UserNS.Size}.WithDefaults()
		log.Info("non-root image user without CAP_SYS_RESOURCE: user namespace mode",
			slog.String("image", imageName), slog.Uint64("uid", uint64(shell.UID)), slog.Bool("other_users", img.Config.OtherUsers()))
	}
	if u.Enabled {
		if img, err = l.Images.Shifted(ctx, imageName, u.HostID, u.Size); err != nil {
			return nil, fmt.Errorf("launch %s: %w", imageName, err)
		}
	}
	id := state.NewID("")
	vol := VolumePrefix + id
	if err := l.Snap.Clone(ctx, img.Snapshot, vol); err != nil {
		return nil, fmt.Errorf("clone image %s: %w", imageName, err)
	}
	defer func() {
		if err != nil {
			if derr := l.Snap.Destroy(context.Background(), vol); derr != nil {
				log.Warn("remove volume of failed launch", slog.String("volume", vol), slog.Any("err", derr))
			}
		}
	}()
	disk, err := SetDiskQuota(ctx, l.Snap, vol, l.Limits)
	if err != nil {
		return nil, err
	}
	iso := l.Isolation
	if len(o.Caps) > 0 {
		iso.Caps = o.Caps
	}
	sb, err := sandbox.Start(ctx, sandbox.Config{
		ID: id, Root: l.Snap.Path(vol), InitBinary: l.InitBinary, Limits: l.Limits, Isolation: iso, Disk: disk, Logger: log, UserNS: u,
		Shell: ShellConfig(img.Config),
	})
	if err != nil {
		return nil, fmt.Errorf("start sandbox on %s: %w", imageName, err)
	}
	return &Env{ID: id, Image: imageName, Volume: vol, Sandbox: sb, snap: l.Snap}, nil
}

// ShellConfig is how the persistent shell starts on an image with config
// c (nil: as root, in /root, with the default environment): the image's
// env, working dir and user (docs/images.md, "The image config in a
// sandbox").
func ShellConfig(c *image.Config) sandbox.ShellConfig {
	if c == nil {
		return sandbox.ShellConfig{}
	}
	return sandbox.ShellConfig{Env: c.Env, Dir: c.WorkingDir, UID: c.UID, GID: c.GID, Groups: c.Groups}
}

// canDumpOtherUsers reports whether this process holds CAP_SYS_RESOURCE,
// which CRIU needs to read the resource limits of a task of another uid.
func canDumpOtherUsers() bool {
	var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_SYS_RESOURCE/32].Effective&(1<<(unix.CAP_SYS_RESOURCE%32)) != 0
}

// SetDiskQuota caps volume vol, the root of a sandbox about to start or be
// restored, at lim's disk quota (sandbox.Limits.DiskQuota) and returns the
// meter its sandbox.Config.Disk takes; with no quota it sets none and
// returns nil. Every sandbox root goes through here: launches, and the
// engine's restores (branch, rollback, promote, warm copies, verify).
// A backend without quotas is refused with cr.ErrUnavailable when a quota
// is asked for: a sandbox never runs with less isolation than configured.
func SetDiskQuota(ctx context.Context, snap cr.Snapshotter, vol string, lim sandbox.Limits) (sandbox.DiskMeter, error) {
	bytes := lim.DiskQuota()
	if bytes == 0 {
		return nil, nil
	}
	q, ok := snap.(cr.Quotaer)
	if !ok {
		return nil, fmt.Errorf("disk quota of %s: %s backend has no quotas (run with a negative disk limit to go without): %w", vol, snap.Backend(), cr.ErrUnavailable)
	}
	if err := q.SetQuota(ctx, vol, bytes); err != nil {
		return nil, fmt.Errorf("disk quota: %w", err)
	}
	meter := func(ctx context.Context) (int64, error) {
		u, err := q.Quota(ctx, vol)
		return u.Free, err
	}
	// Read it back, as every restore checks what it hands out: a root
	// with more room than its quota is not capped.
	free, err := meter(ctx)
	if err != nil {
		return nil, fmt.Errorf("disk quota of %s: %w", vol, err)
	}
	if free > bytes {
		return nil, fmt.Errorf("disk quota of %s: %d bytes free under a %d byte quota: %w", vol, free, bytes, ErrQuotaNotSet)
	}
	return meter, nil
}

// Close destroys the sandbox and its volume.
func (e *Env) Close(ctx context.Context) error {
	serr := e.Sandbox.Destroy(ctx)
	verr := e.snap.Destroy(ctx, e.Volume)
	if errors.Is(verr, cr.ErrNotFound) {
		verr = nil
	}
	return errors.Join(serr, verr)
}
