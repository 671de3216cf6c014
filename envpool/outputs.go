package envpool

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// errOutputsTooLarge: the agent's outputs hold more than the task lets
// the grader copy (max_output_bytes of content, maxOutputEntries paths).
// It is the agent's doing, scored as a failure.
var errOutputsTooLarge = errors.New("the agent's outputs are over the grader's limits")

// maxOutputEntries bounds the paths of the outputs the grader copies (a
// variable for tests).
var maxOutputEntries = 100_000

// outputStats count what tarOutputs wrote.
type outputStats struct {
	Files, Dirs, Links int
	Bytes              int64
	// Missing are outputs the state does not have (or reaches only
	// through a path that leaves the sandbox); Skipped counts sockets and
	// device nodes, which are never copied.
	Missing []string
	Skipped int
}

// tarOutputs writes, for image.ApplyTar on a pristine tree, the agent's
// outputs as they are in the state tree at root (a read-only snapshot):
// for each path a whiteout of what the pristine tree has there, then the
// path's tree. Each path is resolved inside root as the sandbox would
// resolve it (openat2 RESOLVE_IN_ROOT: an absolute symlink or ".." never
// leads out of root); below it nothing is followed, symbolic links are
// copied as links. File content past limit bytes stops it with
// errOutputsTooLarge.
func tarOutputs(ctx context.Context, w io.Writer, root string, paths []string, limit int64) (st outputStats, err error) {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("open state files %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		rel := strings.TrimPrefix(p, "/")
		dir, base := path.Split(rel)
		if err := tw.WriteHeader(&tar.Header{Name: dir + ".wh." + base, Typeflag: tar.TypeReg, Mode: 0o600}); err != nil {
			return st, err
		}
		fd, err := unix.Openat2(rootFD, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) {
				st.Missing = append(st.Missing, p)
				continue
			}
			return st, fmt.Errorf("open output %s: %w", p, err)
		}
		host, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		unix.Close(fd)
		if err != nil {
			return st, fmt.Errorf("resolve output %s: %w", p, err)
		}
		if host != root && !strings.HasPrefix(host, strings.TrimSuffix(root, "/")+"/") {
			return st, fmt.Errorf("output %s resolved to %s, outside the state's files %s", p, host, root)
		}
		err = filepath.WalkDir(host, func(hp string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			name := rel
			if hp != host {
				name = rel + "/" + filepath.ToSlash(strings.TrimPrefix(hp, host+"/"))
			}
			return addOutput(tw, hp, name, &st, limit)
		})
		if err != nil {
			return st, err
		}
	}
	return st, tw.Close()
}

// addOutput writes one path of the outputs (host path hp, in the tar
// name) with its owner, mode and times as the state holds them.
func addOutput(tw *tar.Writer, hp, name string, st *outputStats, limit int64) error {
	if st.Files+st.Dirs+st.Links+st.Skipped >= maxOutputEntries {
		return fmt.Errorf("%w (%d paths)", errOutputsTooLarge, maxOutputEntries)
	}
	fi, err := os.Lstat(hp)
	if err != nil {
		return err
	}
	sys, _ := fi.Sys().(*syscall.Stat_t)
	hdr := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()}
	if sys != nil {
		hdr.Uid, hdr.Gid = int(sys.Uid), int(sys.Gid)
		hdr.Mode = int64(sys.Mode & 0o7777)
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		st.Dirs++
		return tw.WriteHeader(hdr)
	case m&fs.ModeSymlink != 0:
		target, err := os.Readlink(hp)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		st.Links++
		return tw.WriteHeader(hdr)
	case m.IsRegular():
		if st.Bytes+fi.Size() > limit {
			return fmt.Errorf("%w (%d bytes of max_output_bytes)", errOutputsTooLarge, limit)
		}
		f, err := os.OpenFile(hp, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		n, err := io.Copy(tw, io.LimitReader(f, fi.Size()))
		st.Bytes += n
		st.Files++
		return err
	}
	// Sockets, devices and FIFOs are not copied: a FIFO in the grader's
	// tree would block a verifier that reads it until its timeout.
	st.Skipped++
	return nil
}

// tarHidden writes the task's hidden files (its hidden directory, then
// its inline files) under the task's hidden path, after a whiteout of
// whatever the pristine tree has there, owned by the sandbox's root
// (uid, gid on the host) and readable by it alone.
func tarHidden(ctx context.Context, w io.Writer, t Task, uid, gid int) error {
	tw := tar.NewWriter(w)
	rel := strings.TrimPrefix(t.hiddenPath(), "/")
	dir, base := path.Split(rel)
	if err := tw.WriteHeader(&tar.Header{Name: dir + ".wh." + base, Typeflag: tar.TypeReg, Mode: 0o600}); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: rel + "/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: uid, Gid: gid}); err != nil {
		return err
	}
	if t.Hidden != "" {
		err := filepath.WalkDir(t.Hidden, func(hp string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if hp == t.Hidden {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			name := rel + "/" + filepath.ToSlash(strings.TrimPrefix(hp, t.Hidden+"/"))
			hdr := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Uid: uid, Gid: gid}
			switch m := fi.Mode(); {
			case m.IsDir():
				hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
				return tw.WriteHeader(hdr)
			case m&fs.ModeSymlink != 0:
				target, err := os.Readlink(hp)
				if err != nil {
					return err
				}
				hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
				return tw.WriteHeader(hdr)
			case m.IsRegular():
				f, err := os.Open(hp)
				if err != nil {
					return err
				}
				defer f.Close()
				hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
				if err := tw.WriteHeader(hdr); err != nil {
					return err
				}
				_, err = io.Copy(tw, io.LimitReader(f, fi.Size()))
				return err
			}
			return fmt.Errorf("hidden file %s: %s files are not copied", hp, fi.Mode().Type())
		})
		if err != nil {
			return fmt.Errorf("hidden directory %s: %w", t.Hidden, err)
		}
	}
	names := make([]string, 0, len(t.HiddenFiles))
	for n := range t.HiddenFiles {
		names = append(names, n)
	}
	slices.Sort(names)
	made := map[string]bool{}
	for _, n := range names {
		// Their directories first (0700, the sandbox root's).
		for d := path.Dir(n); d != "." && !made[d]; d = path.Dir(d) {
			made[d] = true
		}
	}
	dirs := make([]string, 0, len(made))
	for d := range made {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: rel + "/" + d + "/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: uid, Gid: gid}); err != nil {
			return err
		}
	}
	for _, n := range names {
		body := t.HiddenFiles[n]
		mode := int64(0o600)
		if strings.HasPrefix(body, "#!") {
			mode = 0o700
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel + "/" + n, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(body)), Uid: uid, Gid: gid}); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, body); err != nil {
			return err
		}
	}
	return tw.Close()
}
