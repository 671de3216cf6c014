package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
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
	Logger     *slog.Logger
	// AutoBuild lets Launch build a missing image that has a built-in
	// recipe (busybox, debian), writing progress to Progress.
	AutoBuild bool
	Progress  io.Writer
	// UserNS starts sandboxes in user namespace mode, on copies of the
	// images shifted to its range (image.Store.Shifted).
	UserNS sandbox.UserNSConfig
}

// Env is a running sandbox plus the volume that is its root.
type Env struct {
	ID      string
	Image   string
	Volume  string
	Sandbox *sandbox.Sandbox
	snap    cr.Snapshotter
}

// NewID returns a fresh random environment id.
func NewID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Launch clones image and boots a sandbox on the clone. On failure nothing
// is left behind.
func (l *Launcher) Launch(ctx context.Context, imageName string) (env *Env, err error) {
	log := l.Logger
	if log == nil {
		log = slog.Default()
	}
	img, err := l.Images.Get(ctx, imageName)
	if errors.Is(err, image.ErrNotFound) && l.AutoBuild && slices.Contains(image.Recipes, imageName) {
		log.Info("building missing image", slog.String("image", imageName))
		if err = l.Images.Build(ctx, imageName, l.Progress); err != nil {
			return nil, fmt.Errorf("build image %s: %w", imageName, err)
		}
		img, err = l.Images.Get(ctx, imageName)
	}
	if err != nil {
		return nil, fmt.Errorf("launch %s: %w", imageName, err)
	}
	u := l.UserNS.WithDefaults()
	if u.Enabled {
		if img, err = l.Images.Shifted(ctx, imageName, u.HostID, u.Size); err != nil {
			return nil, fmt.Errorf("launch %s: %w", imageName, err)
		}
	}
	id := NewID()
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
	sb, err := sandbox.Start(ctx, sandbox.Config{
		ID: id, Root: l.Snap.Path(vol), InitBinary: l.InitBinary, Limits: l.Limits, Logger: log, UserNS: u,
	})
	if err != nil {
		return nil, fmt.Errorf("start sandbox on %s: %w", imageName, err)
	}
	return &Env{ID: id, Image: imageName, Volume: vol, Sandbox: sb, snap: l.Snap}, nil
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
