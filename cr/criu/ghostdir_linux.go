package criu

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/arbor-env/arbor/cr/imgdelta"
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

// ghostImages is what a dump's images say of its ghosts (removed files
// and directories a process holds), read once per restore that has any.
type ghostImages struct {
	remaps *crit.CriuImage // remap-fpath.img
	files  *crit.CriuImage // files.img
	ghosts []ghost         // in remaps' order
}

type ghost struct {
	at   int    // index in remaps.Entries
	id   uint32 // the removed file's id in files.img
	dir  bool
	path string // inside the tree's root ("work/d"); "" when unnamed
	root bool   // on the tree's root mount (others CRIU restores itself)
}

// readGhosts reads the ghosts of the images in dir; nil when there are
// none (the usual dump: one failed open of remap-fpath.img).
func readGhosts(dir string) (*ghostImages, error) {
	g := &ghostImages{}
	var err error
	if g.remaps, err = decodeImage(filepath.Join(dir, "remap-fpath.img"), &remap_file_path.RemapFilePathEntry{}, true); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	for i, en := range g.remaps.Entries {
		r := en.Message.(*remap_file_path.RemapFilePathEntry)
		if r.GetRemapType() != remap_file_path.RemapType_GHOST {
			continue
		}
		gf, err := readGhostEntry(filepath.Join(dir, fmt.Sprintf("ghost-file-%x.img", r.GetRemapId())))
		if err != nil {
			return nil, err
		}
		isDir := gf.GetMode()&unix.S_IFMT == unix.S_IFDIR
		g.ghosts = append(g.ghosts, ghost{at: i, id: r.GetOrigId(), dir: isDir})
	}
	if len(g.ghosts) == 0 {
		return nil, nil
	}
	roots, err := rootMounts(dir)
	if err != nil {
		return nil, err
	}
	if g.files, err = decodeImage(filepath.Join(dir, "files.img"), &fdinfo.FileEntry{}, true); err != nil {
		return nil, err
	}
	regs := regFiles(g.files)
	for i := range g.ghosts {
		if r := regs[g.ghosts[i].id]; r != nil {
			g.ghosts[i].path = strings.TrimPrefix(path.Clean("/"+r.GetName()), "/")
			g.ghosts[i].root = roots[uint32(r.GetMntId())]
		}
	}
	return g, nil
}

// regFiles maps the ids of files.img's regular files to their entries.
func regFiles(files *crit.CriuImage) map[uint32]*regfile.RegFileEntry {
	regs := map[uint32]*regfile.RegFileEntry{}
	for _, en := range files.Entries {
		if r := en.Message.(*fdinfo.FileEntry).GetReg(); r != nil {
			regs[r.GetId()] = r
		}
	}
	return regs
}

// rootMounts are the ids of the dumped tree's root mounts (mountpoint /).
func rootMounts(dir string) (map[uint32]bool, error) {
	imgs, err := filepath.Glob(filepath.Join(dir, "mountpoints-*.img"))
	if err != nil {
		return nil, err
	}
	ids := map[uint32]bool{}
	for _, f := range imgs {
		ms, err := decodeImage(f, &mnt.MntEntry{}, false)
		if err != nil {
			return nil, err
		}
		for _, en := range ms.Entries {
			if m := en.Message.(*mnt.MntEntry); m.GetMountpoint() == "/" {
				ids[m.GetMntId()] = true
			}
		}
	}
	return ids, nil
}

// readGhostEntry reads the first entry of a ghost file image, which
// describes the file. go-criu's decoder is not used: for a ghost stored
// in chunks (a larger file, or one with holes) it returns the last chunk
// in the first entry's place (its entries all point to one variable).
func readGhostEntry(file string) (*ghost_file.GhostFileEntry, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if m, err := crit.ReadMagic(f); err != nil || m != "GHOST_FILE" {
		return nil, fmt.Errorf("decode %s: magic %q: %v", filepath.Base(file), m, err)
	}
	var size [4]byte
	if _, err := io.ReadFull(f, size[:]); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Base(file), err)
	}
	buf := make([]byte, binary.LittleEndian.Uint32(size[:]))
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Base(file), err)
	}
	var gf ghost_file.GhostFileEntry
	if err := proto.Unmarshal(buf, &gf); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Base(file), err)
	}
	return &gf, nil
}

// decodeImage reads one CRIU image file, with its payloads when asked
// (to encode it again; a ghost file's contents are not needed).
func decodeImage(file string, typ proto.Message, payload bool) (*crit.CriuImage, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, !payload).Decode(typ)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Base(file), err)
	}
	return img, nil
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
	g, err := readGhosts(dir)
	if err != nil || g == nil {
		return plan, err
	}
	reorder := g.reorder()
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open restore root %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	rename := map[uint32]string{}  // file id -> its hidden name's path
	planned := map[string]string{} // ghost path -> its hidden name's path
	for _, gh := range g.ghosts {
		if !gh.dir || !gh.root || gh.path == "" {
			continue
		}
		if h, ok := planned[gh.path]; ok {
			// The same removed directory held twice (a descriptor
			// and the cwd): one ghost, one swap (a 5,000-turn fuzz
			// run found the second swap failing).
			rename[gh.id] = h
			continue
		}
		parent, name, err := clash(rootFD, gh.path)
		if err != nil {
			plan.close()
			return nil, err
		}
		if parent == nil {
			continue
		}
		hidden := ".arbor-ghost-" + randHex()
		rename[gh.id] = "/" + path.Join(path.Dir(gh.path), hidden)
		planned[gh.path] = rename[gh.id]
		plan.swaps = append(plan.swaps, ghostSwap{parent: parent, name: name, ghost: hidden})
	}
	if len(plan.swaps) == 0 && !reorder {
		return plan, nil
	}
	// Next to the images, as hard links: CRIU's restored tasks read their
	// images after they entered the sandbox's mount namespace, where a
	// symlink to a host path leads nowhere. The image cache removes a
	// ".tmp-" leftover when it opens.
	plan.tmp = filepath.Join(filepath.Dir(dir), ".tmp-ghosts-"+randHex())
	if plan.dir, err = g.write(dir, plan.tmp, rename, reorder); err != nil {
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

// write makes dst a view of the image directory src in which the files
// of rename have their new names and, with reorder, the remap list is
// reordered (reorder); every other image is a hard link to the original
// (images are shared read-only by parallel restores). It changes g.
func (g *ghostImages) write(src, dst string, rename map[uint32]string, reorder bool) (string, error) {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return "", err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if e.Name() == imgdelta.ParentLink && e.Type()&os.ModeSymlink != 0 {
			// A delta image's link to its base, relative: the view
			// sits beside src, so the same target leads there.
			t, err := os.Readlink(filepath.Join(src, e.Name()))
			if err == nil {
				err = os.Symlink(t, filepath.Join(dst, e.Name()))
			}
			if err != nil {
				return "", err
			}
			continue
		}
		if e.Name() == "files.img" || e.Name() == "remap-fpath.img" || !e.Type().IsRegular() {
			continue
		}
		if err := os.Link(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return "", err
		}
	}
	n := 0
	for _, en := range g.files.Entries {
		if r := en.Message.(*fdinfo.FileEntry).GetReg(); r != nil {
			if name, ok := rename[r.GetId()]; ok {
				r.Name = proto.String(name)
				n++
			}
		}
	}
	if n != len(rename) {
		return "", fmt.Errorf("files.img names %d of the %d ghost directories to rename", n, len(rename))
	}
	if err := writeImage(filepath.Join(dst, "files.img"), g.files); err != nil {
		return "", err
	}
	return dst, writeImage(filepath.Join(dst, "remap-fpath.img"), g.remaps)
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

// Nested ghosts. CRIU makes and removes its ghosts in the order of
// remap-fpath.img, both times. A ghost inside a ghost directory (the
// shell's removed cwd, a daemon holding a file that was in it) listed
// after that directory fails the restore: the directory's removal comes
// first and finds it not empty. reorder, when the order is such, lists
// the ghosts in g.remaps files first, then directories deepest first (a
// file then goes to the nearest directory that exists at its making,
// CRIU's fallback, and every removal finds its directory empty) and
// reports that it did.
func (g *ghostImages) reorder() bool {
	unsafe := false
	for i, d := range g.ghosts {
		for _, o := range g.ghosts[i+1:] {
			if d.dir && d.path != "" && strings.HasPrefix(o.path, d.path+"/") {
				unsafe = true
			}
		}
	}
	if !unsafe {
		return false
	}
	order := slices.Clone(g.ghosts)
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if a.dir != b.dir {
			return !a.dir
		}
		return strings.Count(a.path, "/") > strings.Count(b.path, "/")
	})
	entries := slices.Clone(g.remaps.Entries)
	for i, gh := range order {
		g.remaps.Entries[g.ghosts[i].at] = entries[gh.at]
	}
	return true
}
