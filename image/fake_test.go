package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/arbor-env/arbor/cr"
)

// dirSnapshotter is a directory-backed cr.Snapshotter for unit tests:
// snapshots and clones are full copies, read-only is only a flag.
type dirSnapshotter struct {
	root string
	mu   sync.Mutex
	vols map[string]cr.Volume
}

var _ cr.Snapshotter = (*dirSnapshotter)(nil)

func newDirSnapshotter(root string) *dirSnapshotter {
	return &dirSnapshotter{root: root, vols: map[string]cr.Volume{}}
}

func (d *dirSnapshotter) Backend() string         { return "dir" }
func (d *dirSnapshotter) Path(name string) string { return filepath.Join(d.root, name) }

func (d *dirSnapshotter) add(name string, v cr.Volume) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.vols[name]; ok {
		return fmt.Errorf("volume %s: %w", name, cr.ErrExists)
	}
	d.vols[name] = v
	return nil
}

func (d *dirSnapshotter) CreateVolume(_ context.Context, name string) error {
	if err := d.add(name, cr.Volume{Name: name}); err != nil {
		return err
	}
	return os.MkdirAll(d.Path(name), 0o755)
}

func (d *dirSnapshotter) copy(src, dst string, ro bool) error {
	d.mu.Lock()
	_, ok := d.vols[src]
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("volume %s: %w", src, cr.ErrNotFound)
	}
	if err := d.add(dst, cr.Volume{Name: dst, ReadOnly: ro, Parent: src}); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(d.Path(dst)), 0o755); err != nil {
		return err
	}
	if out, err := exec.Command("cp", "-a", d.Path(src), d.Path(dst)).CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %v: %s", err, out)
	}
	return nil
}

func (d *dirSnapshotter) Snapshot(_ context.Context, src, dst string) error {
	return d.copy(src, dst, true)
}

func (d *dirSnapshotter) Clone(_ context.Context, src, dst string) error {
	return d.copy(src, dst, false)
}

func (d *dirSnapshotter) Destroy(_ context.Context, name string) error {
	d.mu.Lock()
	_, ok := d.vols[name]
	delete(d.vols, name)
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("volume %s: %w", name, cr.ErrNotFound)
	}
	return os.RemoveAll(d.Path(name))
}

func (d *dirSnapshotter) List(_ context.Context, prefix string) ([]cr.Volume, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []cr.Volume
	for n, v := range d.vols {
		if strings.HasPrefix(n, prefix) {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (d *dirSnapshotter) Changes(context.Context, string, string) ([]cr.Change, error) {
	return nil, fmt.Errorf("changes: %w", cr.ErrUnavailable)
}
