package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// recipeAptDir is where a package install keeps, inside the build root,
// the apt configuration and keyring it hands apt-get; removed after.
const recipeAptDir = "/tmp/.arbor-recipe-apt"

// runRecipeSteps does a recipe's work in the build root: packages, files,
// run commands, in that order. The chrooted steps get /proc, a minimal
// /dev and the host's resolv.conf, mounted for them and unmounted after.
func (s *Store) runRecipeSteps(ctx context.Context, name string, r *Recipe, base Info, root string, progress io.Writer) (err error) {
	var env *buildEnv
	if len(r.Packages) > 0 || len(r.Run) > 0 {
		if env, err = mountBuildEnv(root); err != nil {
			return err
		}
		defer func() {
			if cerr := env.close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("unmount build environment: %w", cerr))
			}
		}()
	}
	if len(r.Packages) > 0 {
		fmt.Fprintf(progress, "recipe %s: packages %s\n", name, strings.Join(r.Packages, " "))
		start := time.Now()
		if err := s.installPackages(ctx, r, root, progress); err != nil {
			return err
		}
		fmt.Fprintf(progress, "recipe %s: packages installed in %s\n", name, time.Since(start).Round(time.Millisecond))
	}
	if len(r.Files) > 0 {
		fmt.Fprintf(progress, "recipe %s: files\n", name)
		if err := r.copyFiles(root, progress); err != nil {
			return err
		}
	}
	if len(r.Run) == 0 {
		return nil
	}
	dir := "/"
	madeWorkdir := false
	if r.Workdir != "" {
		hp, err := resolveIn(root, r.Workdir)
		if err != nil {
			return err
		}
		if _, err := os.Stat(hp); errors.Is(err, os.ErrNotExist) {
			madeWorkdir = true
		}
		if err := mkdirIn(root, r.Workdir); err != nil {
			return fmt.Errorf("make workdir %s: %w", r.Workdir, err)
		}
		dir = r.Workdir
	}
	shell := "/bin/sh"
	if !isExecutable(root, shell) {
		return fmt.Errorf("%w: run needs /bin/sh in the image", ErrBadRecipe)
	}
	runEnv := r.runEnv(base.Config)
	for i, c := range r.Run {
		fmt.Fprintf(progress, "recipe %s: run %d/%d: %s\n", name, i+1, len(r.Run), c)
		start := time.Now()
		if err := runInRoot(ctx, root, dir, runEnv, r.timeout, progress, shell, "-c", c); err != nil {
			return fmt.Errorf("run[%d] %q: %w", i, c, err)
		}
		fmt.Fprintf(progress, "recipe %s: run %d/%d done in %s\n", name, i+1, len(r.Run), time.Since(start).Round(time.Millisecond))
	}
	if madeWorkdir {
		// The sandbox makes a missing workdir owned by the image's user;
		// one the build made is given to that user too.
		if c, err := r.config(base.Config, root); err == nil && c != nil && (c.UID != 0 || c.GID != 0) {
			hp, _ := resolveIn(root, r.Workdir)
			if err := os.Lchown(hp, int(c.UID), int(c.GID)); err != nil {
				return fmt.Errorf("chown workdir %s: %w", r.Workdir, err)
			}
		}
	}
	return nil
}

// runInRoot runs argv chrooted in root, in in-image directory dir, with
// env, for at most timeout, its output copied to progress. A failure is
// an error wrapping ErrRecipeStep with the exit code and the output's
// tail. Whatever the command left running in its process group is killed.
func runInRoot(ctx context.Context, root, dir string, env []string, timeout time.Duration, progress io.Writer, argv ...string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tail := &tailBuffer{max: 2048}
	var w io.Writer = tail
	if progress != nil && progress != io.Discard {
		w = io.MultiWriter(&syncWriter{w: progress}, tail)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, dir
	cmd.Stdout, cmd.Stderr = w, w
	killGroupOnCancel(cmd)
	cmd.SysProcAttr.Chroot = root
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	out := strings.TrimSpace(tail.String())
	if out != "" {
		out = ": " + out
	}
	var exit *exec.ExitError
	switch {
	case err == nil, errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success():
		return nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("%w: timed out after %s%s", ErrRecipeStep, timeout, out)
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.As(err, &exit):
		return fmt.Errorf("%w: exit code %d%s", ErrRecipeStep, exit.ExitCode(), out)
	}
	return fmt.Errorf("%w: %w%s", ErrRecipeStep, err, out)
}

// buildEnv is what the chrooted steps of a build see mounted in its root:
// /proc, a /dev of a few device nodes and its own devpts, and the host's
// resolv.conf read only (apt and run commands use the host's network).
type buildEnv struct {
	mounts  []string // host paths, in mount order
	created []string // files made to mount on, removed after
}

// mountBuildEnv mounts the build environment in root; on failure it
// undoes what it mounted.
func mountBuildEnv(root string) (_ *buildEnv, err error) {
	e := &buildEnv{}
	defer func() {
		if err != nil {
			if cerr := e.close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}()
	proc, err := e.dirIn(root, "/proc")
	if err != nil {
		return nil, err
	}
	if err := e.mount("proc", proc, "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return nil, err
	}
	dev, err := e.dirIn(root, "/dev")
	if err != nil {
		return nil, err
	}
	if err := e.mount("tmpfs", dev, "tmpfs", syscall.MS_NOSUID|syscall.MS_NOEXEC, "mode=0755,size=16m"); err != nil {
		return nil, err
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		p := filepath.Join(dev, n)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return nil, fmt.Errorf("make /dev/%s: %w", n, err)
		}
		if err := e.mount("/dev/"+n, p, "", syscall.MS_BIND, ""); err != nil {
			return nil, err
		}
	}
	for n, t := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(t, filepath.Join(dev, n)); err != nil {
			return nil, fmt.Errorf("make /dev/%s: %w", n, err)
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return nil, fmt.Errorf("make /dev/%s: %w", d, err)
		}
	}
	if err := os.Chmod(filepath.Join(dev, "shm"), 0o777|os.ModeSticky); err != nil {
		return nil, fmt.Errorf("chmod /dev/shm: %w", err)
	}
	// A private devpts: apt logs dpkg's output through a pty.
	if err := e.mount("devpts", filepath.Join(dev, "pts"), "devpts", syscall.MS_NOSUID|syscall.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return nil, err
	}
	if err := os.Symlink("pts/ptmx", filepath.Join(dev, "ptmx")); err != nil {
		return nil, fmt.Errorf("make /dev/ptmx: %w", err)
	}
	if err := e.bindResolvConf(root); err != nil {
		return nil, err
	}
	return e, nil
}

// dirIn returns the host path of in-image directory p, made when missing.
func (e *buildEnv) dirIn(root, p string) (string, error) {
	if err := mkdirIn(root, p); err != nil {
		return "", fmt.Errorf("make %s: %w", p, err)
	}
	return resolveIn(root, p)
}

func (e *buildEnv) mount(src, target, fstype string, flags uintptr, data string) error {
	if err := syscall.Mount(src, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", src, target, err)
	}
	e.mounts = append(e.mounts, target)
	return nil
}

// bindResolvConf mounts the host's /etc/resolv.conf read-only over the
// image's (on an empty file it makes when the image has none, removed
// after), so that writes in the chroot never reach the host's file.
func (e *buildEnv) bindResolvConf(root string) error {
	const rc = "/etc/resolv.conf"
	if st, err := os.Stat(rc); err != nil || !st.Mode().IsRegular() {
		return nil // no name service to lend
	}
	hp, err := resolveIn(root, rc)
	if err != nil {
		return err
	}
	st, err := os.Stat(hp)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, err := os.Stat(filepath.Dir(hp)); err != nil {
			return nil // no /etc (or where a link points): no name service
		}
		if err := os.WriteFile(hp, nil, 0o644); err != nil {
			return fmt.Errorf("make %s: %w", rc, err)
		}
		e.created = append(e.created, hp)
	case err != nil:
		return fmt.Errorf("stat %s: %w", rc, err)
	case !st.Mode().IsRegular():
		return nil
	}
	if err := e.mount(rc, hp, "", syscall.MS_BIND, ""); err != nil {
		return err
	}
	return e.mount("", hp, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, "")
}

// close unmounts the environment, last mount first, and removes the files
// it made.
func (e *buildEnv) close() error {
	var errs []error
	for i := len(e.mounts) - 1; i >= 0; i-- {
		if i > 0 && e.mounts[i] == e.mounts[i-1] {
			continue // a remount of the same mount
		}
		if err := syscall.Unmount(e.mounts[i], syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			errs = append(errs, fmt.Errorf("unmount %s: %w", e.mounts[i], err))
		}
	}
	e.mounts = nil
	for _, f := range e.created {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	e.created = nil
	return errors.Join(errs...)
}

// installPackages installs the recipe's packages with the image's own
// apt-get, chrooted, from the host's apt source for the image's Debian
// release (hostAptSource, as the debian build uses): the image's own
// sources are not read. Downloaded .debs are kept in the build cache
// (debs-<suite>, shared with debootstrap) for the next build; the package
// lists are dropped from the image after.
func (s *Store) installPackages(ctx context.Context, r *Recipe, root string, progress io.Writer) (err error) {
	if !isExecutable(root, "/usr/bin/apt-get") {
		return fmt.Errorf("%w: packages need a Debian base with apt-get", ErrBadRecipe)
	}
	suite := osReleaseField(root, "VERSION_CODENAME")
	if suite == "" {
		return fmt.Errorf("%w: packages need a Debian base (no VERSION_CODENAME in its /etc/os-release)", ErrBadRecipe)
	}
	uri, keyring, err := hostAptSource(etcApt, suite, "main")
	if err != nil {
		return fmt.Errorf("find the host's apt source for %s: %w", suite, err)
	}
	aptDir, err := resolveIn(root, recipeAptDir)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(aptDir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(aptDir, "sources.list.d"), 0o755); err != nil {
		return fmt.Errorf("make %s: %w", recipeAptDir, err)
	}
	var mounts buildEnv
	defer func() {
		// Only once nothing is mounted in it may the root be tidied: the
		// .debs under a mounted cache are the cache's.
		if cerr := mounts.close(); cerr != nil {
			err = errors.Join(err, cerr)
			return
		}
		err = errors.Join(err, os.RemoveAll(aptDir), tidyApt(root))
	}()
	opts := ""
	if keyring != "" && filepath.IsAbs(keyring) {
		if _, err := os.Stat(keyring); err == nil {
			in := path.Join(recipeAptDir, "keyring"+filepath.Ext(keyring))
			if err := copyFile(keyring, filepath.Join(aptDir, path.Base(in)), 0o644); err != nil {
				return err
			}
			opts = " [signed-by=" + in + "]"
		}
	}
	sources := fmt.Sprintf("deb%s %s %s main\n", opts, uri, suite)
	if err := os.WriteFile(filepath.Join(aptDir, "sources.list"), []byte(sources), 0o644); err != nil {
		return err
	}
	conf := fmt.Sprintf("Dir::Etc::SourceList %q;\nDir::Etc::SourceParts %q;\n"+
		"APT::Install-Recommends \"false\";\nAPT::Get::Assume-Yes \"true\";\n"+
		// The chroot is the sandbox; _apt may not reach into it (a root
		// directory of mode 0700) and apt would only warn and go on as root.
		"APT::Sandbox::User \"root\";\n"+
		// dpkg need not fsync: the build volume is snapshotted (which
		// writes it out) or destroyed.
		"Dpkg::Options { \"--force-confdef\"; \"--force-confold\"; \"--force-unsafe-io\"; };\n%s",
		path.Join(recipeAptDir, "sources.list"), path.Join(recipeAptDir, "sources.list.d"), hostAcquireConfig(ctx))
	if err := os.WriteFile(filepath.Join(aptDir, "apt.conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	// Services must not start in a build root.
	policy, err := placeIn(root, "/usr/sbin/policy-rc.d")
	if err != nil {
		return err
	}
	if _, err := os.Lstat(policy); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
			return fmt.Errorf("write policy-rc.d: %w", err)
		}
		defer os.Remove(policy)
	}
	unlock, err := s.lendDebCache(ctx, root, suite, &mounts)
	if err != nil {
		return err
	}
	defer unlock()
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
		"LC_ALL=C.UTF-8", "DEBIAN_FRONTEND=noninteractive"}
	aptConf := path.Join(recipeAptDir, "apt.conf")
	fmt.Fprintf(progress, "packages: apt-get from %s %s main\n", uri, suite)
	if err := runInRoot(ctx, root, "/", env, r.timeout, progress, "/usr/bin/apt-get", "-c", aptConf, "-q", "update"); err != nil {
		return fmt.Errorf("apt-get update: %w", err)
	}
	argv := append([]string{"/usr/bin/apt-get", "-c", aptConf, "-q", "install", "--"}, r.Packages...)
	if err := runInRoot(ctx, root, "/", env, r.timeout, progress, argv...); err != nil {
		return fmt.Errorf("apt-get install %s: %w", strings.Join(r.Packages, " "), err)
	}
	return nil
}

// lendDebCache bind-mounts the build cache's .deb directory for suite
// over the root's /var/cache/apt/archives, holding its lock (builds in
// this and other processes take turns) until the returned unlock. When
// the cache cannot be made the build goes on without it.
func (s *Store) lendDebCache(ctx context.Context, root, suite string, mounts *buildEnv) (unlock func(), err error) {
	unlock = func() {}
	debs := filepath.Join(s.cacheDir(), "debs-"+suite)
	if err := os.MkdirAll(debs, 0o755); err != nil {
		s.logger().Warn("no .deb cache for recipe packages", slog.String("dir", debs), slog.Any("err", err))
		return unlock, nil
	}
	lock, err := os.Open(debs)
	if err != nil {
		return unlock, fmt.Errorf("open deb cache: %w", err)
	}
	for {
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			lock.Close()
			return unlock, fmt.Errorf("lock deb cache: %w", err)
		}
		select {
		case <-ctx.Done():
			lock.Close()
			return unlock, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	unlock = func() { lock.Close() } // closing releases the flock
	archives, err := mounts.dirIn(root, "/var/cache/apt/archives")
	if err == nil {
		err = mounts.mount(debs, archives, "", syscall.MS_BIND, "")
	}
	if err != nil {
		unlock()
		return func() {}, err
	}
	return unlock, nil
}

// tidyApt drops what an install leaves that an image does not need: the
// package lists (fetched again by whoever updates), apt's binary caches and
// any .debs not kept in the build cache.
func tidyApt(root string) error {
	for _, pat := range []string{"/var/lib/apt/lists/*_*", "/var/cache/apt/*.bin", "/var/cache/apt/archives/*.deb"} {
		dir, err := resolveIn(root, path.Dir(pat))
		if err != nil {
			return err
		}
		files, _ := filepath.Glob(filepath.Join(dir, path.Base(pat)))
		for _, f := range files {
			if err := os.Remove(f); err != nil {
				return fmt.Errorf("tidy apt: %w", err)
			}
		}
	}
	return nil
}

// osReleaseField returns field of the image's /etc/os-release (or
// /usr/lib/os-release), unquoted; "" when absent.
func osReleaseField(root, field string) string {
	for _, p := range []string{"/etc/os-release", "/usr/lib/os-release"} {
		hp, err := resolveIn(root, p)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(hp)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok && k == field {
				return strings.Trim(v, `"'`)
			}
		}
		return ""
	}
	return ""
}

// hostAcquireKeys are the host's apt settings a chrooted apt-get gets
// too: how this machine reaches its apt source (proxies) and the checks it
// relaxes for it (a snapshot mirror's expired Release files).
var hostAcquireKeys = []string{
	"acquire::http::proxy", "acquire::https::proxy", "acquire::ftp::proxy",
	"acquire::check-valid-until", "acquire::check-date", "acquire::retries",
}

// hostAcquireConfig returns the host's settings of hostAcquireKeys as
// apt.conf lines (apt-config dump); "" when apt-config is missing.
func hostAcquireConfig(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "apt-config", "dump").Output()
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, line := range strings.Split(string(out), "\n") {
		k, _, _ := strings.Cut(line, " ")
		lk := strings.ToLower(k)
		for _, want := range hostAcquireKeys {
			if lk == want || strings.HasPrefix(lk, want+"::") {
				b.WriteString(line + "\n")
				break
			}
		}
	}
	return b.String()
}
