package image

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Recipes lists the images Build knows how to make.
var Recipes = []string{"busybox", "debian"}

// BusyboxPath is where Debian's busybox-static package installs busybox.
const BusyboxPath = "/bin/busybox"

// Build makes image name from its built-in recipe ("busybox" or "debian"),
// writing human-readable progress to progress (which may be nil).
func (s *Store) Build(ctx context.Context, name string, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	var fill func(ctx context.Context, root string, progress io.Writer) (string, error)
	switch name {
	case "busybox":
		fill = s.fillBusybox
	case "debian":
		fill = s.fillDebian
	default:
		return fmt.Errorf("build %s: %w (known: %s)", name, ErrUnknownRecipe, strings.Join(Recipes, ", "))
	}
	return s.create(ctx, name, "", func(ctx context.Context, root string, progress io.Writer) (metadata, error) {
		src, err := fill(ctx, root, progress)
		return metadata{Source: src}, err
	}, progress)
}

// fillBusybox lays out a minimal root around the host's static busybox: one
// symlink per applet, /bin/sh, and the /etc files tools expect.
func (s *Store) fillBusybox(ctx context.Context, root string, progress io.Writer) (string, error) {
	bb := BusyboxPath
	if err := checkStatic(bb); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, bb, "--list-full").Output()
	if err != nil {
		return "", fmt.Errorf("list busybox applets: %w", err)
	}
	applets := strings.Fields(string(out))
	if progress == nil {
		progress = io.Discard
	}
	fmt.Fprintf(progress, "busybox: %d applets from %s\n", len(applets), bb)
	return "busybox-static " + bb, layoutBusybox(root, bb, applets)
}

// WriteBusyboxTree lays out the busybox image's tree in the directory
// root, as Build("busybox") does: test images are built on it.
func WriteBusyboxTree(ctx context.Context, root string) error {
	_, err := (&Store{}).fillBusybox(ctx, root, nil)
	return err
}

// checkStatic fails unless path is a statically linked executable, since a
// dynamic busybox would not run in a root without its libraries.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("%w: %s (install busybox-static)", ErrMissingTool, path)
		}
		return fmt.Errorf("inspect %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: %s is dynamically linked (install busybox-static)", ErrMissingTool, path)
		}
	}
	return nil
}

// layoutBusybox writes the busybox root: busybox itself, one absolute
// symlink per applet path (as printed by busybox --list-full), and the
// skeleton directories and files.
func layoutBusybox(root, busybox string, applets []string) error {
	dirs := []struct {
		path string
		mode os.FileMode
	}{
		{"bin", 0o755}, {"sbin", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
		{"etc", 0o755}, {"root", 0o700}, {"tmp", 0o777 | os.ModeSticky},
		{"proc", 0o555}, {"dev", 0o755}, {"sys", 0o555}, {"run", 0o755},
		{"var/tmp", 0o777 | os.ModeSticky}, {"work", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("make /%s: %w", d.path, err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("chmod /%s: %w", d.path, err)
		}
	}
	if err := copyFile(busybox, filepath.Join(root, "bin/busybox"), 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\nnogroup:x:65534:\n",
		"etc/hostname": "arbor\n",
		"etc/hosts":    "127.0.0.1\tlocalhost arbor\n::1\tlocalhost\n",
	}
	for p, content := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			return fmt.Errorf("write /%s: %w", p, err)
		}
	}
	links := append([]string{"bin/sh"}, applets...)
	for _, a := range links {
		a = strings.TrimPrefix(filepath.Clean("/"+a), "/")
		if a == "bin/busybox" || a == "" {
			continue
		}
		p := filepath.Join(root, a)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("make dir for /%s: %w", a, err)
		}
		if err := os.Symlink("/bin/busybox", p); err != nil && !os.IsExist(err) {
			return fmt.Errorf("link /%s: %w", a, err)
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("copy %s: %w", src, cerr)
		}
	}()
	if _, err := io.Copy(out, in); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}
