package criu

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	ghost_file "github.com/checkpoint-restore/go-criu/v7/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/regfile"
	remap_file_path "github.com/checkpoint-restore/go-criu/v7/crit/images/remap-file-path"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// Deleted directories at restore (docs/inspector.md, "What a restore
// brings back"). A process can hold a directory that was removed: its
// cwd, or an open descriptor. CRIU dumps it as a "ghost" directory and at
// restore makes a directory at the old path, opens it for the process and
// removes it again. When the tree has a new directory at that path (the
// agent ran rmdir d; mkdir d), CRIU's mkdir finds it, the process gets the
// new directory, and the removal takes it away (if empty) or fails the
// restore (if not). Restore therefore moves what stands at such a path
// aside for the restore and puts it back before the tree resumes (CRIU's
// post-restore notification: the ghosts are gone by then, no task runs).

// ghostDirs lists the deleted directories the images in dir hold, as
// paths inside the tree's root file system ("work/d"). Directories on
// other mounts than the root are left out (CRIU restores those mounts
// itself).
func ghostDirs(dir string) ([]string, error) {
	remaps, err := decodeImage(filepath.Join(dir, "remap-fpath.img"), &remap_file_path.RemapFilePathEntry{})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ghosts := map[uint32]bool{} // file ids of ghost directories
	for _, en := range remaps {
		r := en.(*remap_file_path.RemapFilePathEntry)
		if r.GetRemapType() != remap_file_path.RemapType_GHOST {
			continue
		}
		g, err := decodeImage(filepath.Join(dir, fmt.Sprintf("ghost-file-%x.img", r.GetRemapId())), &ghost_file.GhostFileEntry{})
		if err != nil {
			return nil, err
		}
		if len(g) > 0 && g[0].(*ghost_file.GhostFileEntry).GetMode()&unix.S_IFMT == unix.S_IFDIR {
			ghosts[r.GetOrigId()] = true
		}
	}
	if len(ghosts) == 0 {
		return nil, nil
	}
	roots, err := rootMounts(dir)
	if err != nil {
		return nil, err
	}
	var regs []*regfile.RegFileEntry
	files, err := decodeImage(filepath.Join(dir, "files.img"), &fdinfo.FileEntry{})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, en := range files {
		if f := en.(*fdinfo.FileEntry); f.GetReg() != nil {
			regs = append(regs, f.GetReg())
		}
	}
	old, err := decodeImage(filepath.Join(dir, "reg-files.img"), &regfile.RegFileEntry{}) // before CRIU 3.x's files.img
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, en := range old {
		regs = append(regs, en.(*regfile.RegFileEntry))
	}
	seen := map[string]bool{}
	var out []string
	for _, r := range regs {
		if !ghosts[r.GetId()] || !roots[uint32(r.GetMntId())] {
			continue
		}
		p := strings.TrimPrefix(path.Clean("/"+r.GetName()), "/")
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out) // parents before children
	return out, nil
}

// rootMounts are the ids of the dumped tree's root mounts (mountpoint /).
func rootMounts(dir string) (map[uint32]bool, error) {
	imgs, err := filepath.Glob(filepath.Join(dir, "mountpoints-*.img"))
	if err != nil {
		return nil, err
	}
	ids := map[uint32]bool{}
	for _, f := range imgs {
		ms, err := decodeImage(f, &mnt.MntEntry{})
		if err != nil {
			return nil, err
		}
		for _, en := range ms {
			if m := en.(*mnt.MntEntry); m.GetMountpoint() == "/" {
				ids[m.GetMntId()] = true
			}
		}
	}
	return ids, nil
}

// decodeImage reads the entries of one CRIU image file.
func decodeImage(file string, typ proto.Message) ([]proto.Message, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, true).Decode(typ)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Base(file), err)
	}
	out := make([]proto.Message, len(img.Entries))
	for i, en := range img.Entries {
		out[i] = en.Message
	}
	return out, nil
}

// setAside is what stood at ghost directory paths, moved out of CRIU's
// way for one restore.
type setAside struct {
	moved []aside
}

type aside struct {
	parent    *os.File // the directory holding both names
	name, tmp string
}

// moveAside moves whatever stands at each of paths (inside root) to a
// hidden name next to it. Paths are resolved inside root without
// following symlinks: a component that is a symlink (the agent's doing)
// is left alone, and so is a path where nothing stands.
func moveAside(root string, paths []string) (*setAside, error) {
	s := &setAside{}
	if len(paths) == 0 {
		return s, nil
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open restore root %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	for _, p := range paths {
		dir, name := path.Split(p)
		if dir == "" {
			dir = "."
		}
		fd, err := unix.Openat2(rootFD, dir, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			continue // no parent to clash in (CRIU makes it), or not ours to touch
		}
		if err != nil {
			s.undo()
			return nil, fmt.Errorf("open %s in the restore root: %w", dir, err)
		}
		parent := os.NewFile(uintptr(fd), dir)
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			parent.Close()
			continue // nothing there: CRIU's ghost does not clash
		}
		tmp := ".arbor-aside-" + randHex()
		if err := unix.Renameat2(fd, name, fd, tmp, unix.RENAME_NOREPLACE); err != nil {
			parent.Close()
			s.undo()
			return nil, fmt.Errorf("move %s aside for the restore: %w", p, err)
		}
		s.moved = append(s.moved, aside{parent: parent, name: name, tmp: tmp})
	}
	return s, nil
}

// putBack moves everything back, last first. CRIU has removed its ghost
// directories by then; one still standing is an error (the tree would see
// CRIU's empty directory instead of its own).
func (s *setAside) putBack() error {
	var errs []error
	for i := len(s.moved) - 1; i >= 0; i-- {
		a := s.moved[i]
		if err := unix.Renameat2(int(a.parent.Fd()), a.tmp, int(a.parent.Fd()), a.name, unix.RENAME_NOREPLACE); err != nil {
			errs = append(errs, fmt.Errorf("put %s back after the restore: %w", filepath.Join(a.parent.Name(), a.name), err))
		}
		a.parent.Close()
	}
	s.moved = nil
	return errors.Join(errs...)
}

// undo is putBack for a restore that did not happen; errors go nowhere
// (the restore failed already, and its clone is discarded).
func (s *setAside) undo() { s.putBack() }

func randHex() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}
