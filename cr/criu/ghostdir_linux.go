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
// restore makes a directory at the old path, gives it to the process and
// removes it once the tree is back. When the tree has something new at
// that path (the agent ran rmdir d; mkdir d), CRIU's mkdir finds the new
// directory, the process gets it, and the removal takes it away (if
// empty) or fails the restore (if not). Restore therefore has CRIU make
// such a ghost under a hidden name next to the path (a copy of the
// image's file list with that one name changed; the other images are
// links to the originals) and, once the tree is restored but before it
// runs (CRIU's post-restore notification), swaps it in: the real
// directory aside, the ghost renamed to the path and removed there (so
// the process's cwd reads "/path (deleted)", as it did), an empty
// directory left at the hidden name for CRIU's own removal, the real
// directory back.

// ghostDirs lists the deleted directories the images in dir hold, as
// paths inside the tree's root file system ("work/d"). Directories on
// other mounts than the root are left out (CRIU restores those mounts
// itself).
func ghostDirs(dir string) ([]ghostDir, error) {
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
	var out []ghostDir
	for _, r := range regs {
		if !ghosts[r.GetId()] || !roots[uint32(r.GetMntId())] {
			continue
		}
		if p := strings.TrimPrefix(path.Clean("/"+r.GetName()), "/"); p != "" {
			out = append(out, ghostDir{id: r.GetId(), path: p})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out, nil
}

// ghostDir is a deleted directory of a dump: its file id in the images
// and its path inside the root.
type ghostDir struct {
	id   uint32
	path string
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

// ghostPlan is how one restore gets its ghost directories: the image
// directory to give CRIU and the swaps to make at post-restore.
type ghostPlan struct {
	dir   string // r.Dir, or the copy with the hidden names
	tmp   string // that copy, removed by close
	swaps []ghostSwap
}

type ghostSwap struct {
	parent      *os.File // the directory holding the path and the hidden name
	name, ghost string
}

// planGhosts looks, for each ghost directory of the images in dir, at
// what stands at its path in root, resolved inside root without following
// symlinks (a component that is a symlink, the agent's doing, is left to
// CRIU as before). Where something stands, the ghost gets a hidden name
// next to it, in a copy of the image directory made next to dir.
func planGhosts(dir, root string) (*ghostPlan, error) {
	plan := &ghostPlan{dir: dir}
	ghosts, err := ghostDirs(dir)
	if err != nil || len(ghosts) == 0 {
		return plan, err
	}
	remaps, err := reorderedRemaps(dir)
	if err != nil {
		return nil, err
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open restore root %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	rename := map[uint32]string{} // file id -> its hidden name's path
	for _, g := range ghosts {
		parent, name, err := clash(rootFD, g.path)
		if err != nil {
			plan.close()
			return nil, err
		}
		if parent == nil {
			continue
		}
		ghost := ".arbor-ghost-" + randHex()
		rename[g.id] = "/" + path.Join(path.Dir(g.path), ghost)
		plan.swaps = append(plan.swaps, ghostSwap{parent: parent, name: name, ghost: ghost})
	}
	if len(plan.swaps) == 0 && remaps == nil {
		return plan, nil
	}
	// Next to the images, as hard links: CRIU's restored tasks read their
	// images after they entered the sandbox's mount namespace, where a
	// symlink to a host path leads nowhere. The image cache removes a
	// ".tmp-" leftover when it opens.
	plan.tmp = filepath.Join(filepath.Dir(dir), ".tmp-ghosts-"+randHex())
	if plan.dir, err = renamedImages(dir, plan.tmp, rename, remaps); err != nil {
		plan.close()
		return nil, err
	}
	return plan, nil
}

// clash opens the directory holding p (a path inside the root rootFD)
// when something stands at p; parent is nil when nothing does, when the
// directory does not exist, or when a component of the way is a symlink
// (never followed: it could lead out of the root, to the host's own
// directories).
func clash(rootFD int, p string) (parent *os.File, name string, err error) {
	pdir, name := path.Split(p)
	if pdir == "" {
		pdir = "."
	}
	fd, err := unix.Openat2(rootFD, pdir, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
		return nil, name, nil
	}
	if err != nil {
		return nil, name, fmt.Errorf("open %s in the restore root: %w", pdir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		unix.Close(fd)
		return nil, name, nil
	}
	return os.NewFile(uintptr(fd), pdir), name, nil
}

// renamedImages makes dst a view of the image directory src whose file
// list gives the files of rename their new names and whose remap list is
// remaps (nil: src's); every other image is a hard link to the original
// (images are shared read-only by parallel restores).
func renamedImages(src, dst string, rename map[uint32]string, remaps *crit.CriuImage) (string, error) {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return "", err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if e.Name() == "files.img" || (e.Name() == "remap-fpath.img" && remaps != nil) || !e.Type().IsRegular() {
			continue
		}
		if err := os.Link(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return "", err
		}
	}
	if remaps != nil {
		if err := writeImage(filepath.Join(dst, "remap-fpath.img"), remaps); err != nil {
			return "", err
		}
	}
	in, err := os.Open(filepath.Join(src, "files.img"))
	if err != nil {
		return "", err
	}
	defer in.Close()
	img, err := crit.New(in, nil, "", false, false).Decode(&fdinfo.FileEntry{})
	if err != nil {
		return "", fmt.Errorf("decode files.img: %w", err)
	}
	n := 0
	for _, en := range img.Entries {
		if f, ok := en.Message.(*fdinfo.FileEntry); ok && f.GetReg() != nil {
			if name, ok := rename[f.GetReg().GetId()]; ok {
				f.GetReg().Name = proto.String(name)
				n++
			}
		}
	}
	if n != len(rename) {
		return "", fmt.Errorf("files.img names %d of the %d ghost directories to rename", n, len(rename))
	}
	return dst, writeImage(filepath.Join(dst, "files.img"), img)
}

// writeImage encodes img into a new file.
func writeImage(file string, img *crit.CriuImage) error {
	out, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := crit.New(nil, out, "", false, false).Encode(img); err != nil {
		out.Close()
		return fmt.Errorf("encode %s: %w", filepath.Base(file), err)
	}
	return out.Close()
}

// swap puts each ghost at its path and removes it there, with the
// tree's own directory out of the way meanwhile and back after, and
// leaves an empty directory at the hidden name for CRIU to remove. The
// tree is restored and stopped: CRIU has opened every ghost, no task
// runs.
func (p *ghostPlan) swap() error {
	var errs []error
	for _, s := range p.swaps {
		fd := int(s.parent.Fd())
		aside := ".arbor-aside-" + randHex()
		steps := []struct {
			what string
			do   func() error
		}{
			{"move it aside", func() error { return unix.Renameat2(fd, s.name, fd, aside, unix.RENAME_NOREPLACE) }},
			{"move the ghost to its path", func() error { return unix.Renameat2(fd, s.ghost, fd, s.name, unix.RENAME_NOREPLACE) }},
			{"remove the ghost", func() error { return unix.Unlinkat(fd, s.name, unix.AT_REMOVEDIR) }},
			{"leave CRIU its hidden name", func() error { return unix.Mkdirat(fd, s.ghost, 0o700) }},
			{"move it back", func() error { return unix.Renameat2(fd, aside, fd, s.name, unix.RENAME_NOREPLACE) }},
		}
		for _, st := range steps {
			if err := st.do(); err != nil {
				errs = append(errs, fmt.Errorf("deleted directory %s: %s: %w", filepath.Join(s.parent.Name(), s.name), st.what, err))
				break
			}
		}
	}
	return errors.Join(errs...)
}

func (p *ghostPlan) close() {
	for _, s := range p.swaps {
		s.parent.Close()
	}
	p.swaps = nil
	if p.tmp != "" {
		os.RemoveAll(p.tmp)
		p.tmp = ""
	}
}

func randHex() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Nested ghosts. CRIU makes and removes its ghosts (removed files a
// process holds, removed directories) in the order of remap-fpath.img,
// both times. A ghost inside a ghost directory (the shell's removed cwd,
// a daemon holding a file that was in it) listed after that directory
// fails the restore: the directory's removal comes first and finds it
// not empty. reorderedRemaps returns the image with its ghosts listed
// files first, then directories deepest first, when its order is such
// (nil when it is not): a file then goes to the nearest directory that
// exists at its making (CRIU's fallback), and every removal finds its
// directory empty.
func reorderedRemaps(dir string) (*crit.CriuImage, error) {
	in, err := os.Open(filepath.Join(dir, "remap-fpath.img"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer in.Close()
	img, err := crit.New(in, nil, "", false, false).Decode(&remap_file_path.RemapFilePathEntry{})
	if err != nil {
		return nil, fmt.Errorf("decode remap-fpath.img: %w", err)
	}
	names := map[uint32]string{}
	files, err := decodeImage(filepath.Join(dir, "files.img"), &fdinfo.FileEntry{})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, en := range files {
		if f := en.(*fdinfo.FileEntry); f.GetReg() != nil {
			names[f.GetReg().GetId()] = path.Clean("/" + f.GetReg().GetName())
		}
	}
	type ghost struct {
		at    int // index in img.Entries
		dir   bool
		path  string
		entry *crit.CriuEntry
	}
	var ghosts []ghost
	for i, en := range img.Entries {
		r := en.Message.(*remap_file_path.RemapFilePathEntry)
		if r.GetRemapType() != remap_file_path.RemapType_GHOST {
			continue
		}
		g, err := decodeImage(filepath.Join(dir, fmt.Sprintf("ghost-file-%x.img", r.GetRemapId())), &ghost_file.GhostFileEntry{})
		if err != nil {
			return nil, err
		}
		isDir := len(g) > 0 && g[0].(*ghost_file.GhostFileEntry).GetMode()&unix.S_IFMT == unix.S_IFDIR
		ghosts = append(ghosts, ghost{at: i, dir: isDir, path: names[r.GetOrigId()], entry: en})
	}
	unsafe := false
	for i, d := range ghosts {
		for _, g := range ghosts[i+1:] {
			if d.dir && d.path != "" && strings.HasPrefix(g.path, d.path+"/") {
				unsafe = true
			}
		}
	}
	if !unsafe {
		return nil, nil
	}
	slots := make([]int, len(ghosts))
	for i, g := range ghosts {
		slots[i] = g.at
	}
	sort.SliceStable(ghosts, func(i, j int) bool {
		a, b := ghosts[i], ghosts[j]
		if a.dir != b.dir {
			return !a.dir
		}
		return strings.Count(a.path, "/") > strings.Count(b.path, "/")
	})
	for i, g := range ghosts {
		img.Entries[slots[i]] = g.entry
	}
	return img, nil
}
