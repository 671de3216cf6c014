package criu

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	remap_file_path "github.com/checkpoint-restore/go-criu/v7/crit/images/remap-file-path"
	"golang.org/x/sys/unix"
)

// Removed files linked elsewhere (docs/inspector.md, "What a restore
// brings back"). A process can hold a file whose name was removed while
// another name still links it (ln a b; rm a, with a open): the file is
// neither at its path nor a ghost (CRIU copies only files no name links).
// CRIU dumps it with a link remap: during the dump it links the file at a
// new name next to the old one (link_remap.N), records that name, and,
// as the tree keeps running, removes the link after the dump. A restore
// opens the file by that name, so the name must exist in the restored
// root, which was cloned from a snapshot without it. After the dump
// (CRIU's post-dump notification, while the links still exist), Dump
// records each such name with the file's inode in linksFile; Restore finds
// the inode under another name in the new root (snapshot clones keep
// inode numbers) and links it at the recorded name before CRIU starts,
// and removes what CRIU leaves of it.

// linksFile in an image directory lists its link remaps.
const linksFile = "arbor-links.json"

// linkRemap is one name CRIU's restore opens a removed-but-linked file by.
type linkRemap struct {
	Name string `json:"name"` // inside the tree's root ("tmp/link_remap.5")
	Ino  uint64 `json:"ino"`
}

// recordLinks writes linksFile for the link remaps of the dump in dir,
// whose tree's root is root on the host; nothing when there are none.
func recordLinks(dir, root string) error {
	remaps, err := decodeImage(filepath.Join(dir, "remap-fpath.img"), &remap_file_path.RemapFilePathEntry{}, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	want := map[uint32]uint32{} // the link's file id -> the removed file's
	for _, en := range remaps.Entries {
		if r := en.Message.(*remap_file_path.RemapFilePathEntry); r.GetRemapType() == remap_file_path.RemapType_LINKED {
			want[r.GetRemapId()] = r.GetOrigId()
		}
	}
	if len(want) == 0 {
		return nil
	}
	roots, err := rootMounts(dir)
	if err != nil {
		return err
	}
	files, err := decodeImage(filepath.Join(dir, "files.img"), &fdinfo.FileEntry{}, false)
	if err != nil {
		return err
	}
	regs := regFiles(files)
	var links []linkRemap
	for id, orig := range want {
		r, o := regs[id], regs[orig]
		if r == nil || o == nil {
			return fmt.Errorf("link remap %d of file %d has no file entry", id, orig)
		}
		name := strings.TrimPrefix(path.Clean("/"+r.GetName()), "/")
		// The link's own entry names no mount; the removed file's does.
		if !roots[uint32(o.GetMntId())] {
			// On a mount whose contents CRIU dumps itself (the
			// sandbox's tmpfs), which then holds the link.
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, name), &st); err != nil {
			return fmt.Errorf("link remap %s: %w", name, err)
		}
		links = append(links, linkRemap{Name: name, Ino: st.Ino})
	}
	if len(links) == 0 {
		return nil
	}
	b, err := json.Marshal(links)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, linksFile), b, 0o644)
}

// placedLink is a name placeLinks made: name in the directory parent.
type placedLink struct {
	parent *os.File
	name   string
}

// placeLinks makes, in the new root, the names the images in dir open
// removed-but-linked files by, and returns them (for unplaceLinks). The
// root is the sandbox's, which its agent wrote: each name's directory is
// resolved inside it (openat2 RESOLVE_IN_ROOT, as the restored tree
// resolves it, a symlink on the way leading to the root's own directories
// and never out of it), and the link made relative to that directory, so
// that no symlink can put the host's link outside the root.
func placeLinks(dir, root string) (made []placedLink, err error) {
	b, err := os.ReadFile(filepath.Join(dir, linksFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var links []linkRemap
	if err := json.Unmarshal(b, &links); err != nil {
		return nil, fmt.Errorf("%s: %w", linksFile, err)
	}
	byIno := map[uint64]string{}
	for _, l := range links {
		byIno[l.Ino] = ""
	}
	// One walk finds a name for every inode: the root is a snapshot
	// clone, with the inode numbers of the tree that was dumped. The walk
	// follows no symlink; the names it finds are relative to the root.
	left := len(byIno)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if left == 0 {
			return filepath.SkipAll
		}
		if err != nil || d.IsDir() {
			return nil // an unreadable directory holds no name we need
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if at, ok := byIno[st.Ino]; ok && at == "" {
			if rel, err := filepath.Rel(root, p); err == nil {
				byIno[st.Ino] = rel
				left--
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the restore root: %w", err)
	}
	defer unix.Close(rootFD)
	defer func() {
		if err != nil {
			unplaceLinks(made)
			made = nil
		}
	}()
	for _, l := range links {
		src := byIno[l.Ino]
		if src == "" {
			return made, fmt.Errorf("a process holds a removed file (inode %d) that no name in the restored root links any more", l.Ino)
		}
		if err := linkInRoot(rootFD, src, l.Name, &made); err != nil {
			return made, fmt.Errorf("link the removed file held open at %s: %w", l.Name, err)
		}
	}
	return made, nil
}

// linkInRoot links the file at src at dst, both paths inside the root
// rootFD resolved in it, and adds dst to made.
func linkInRoot(rootFD int, src, dst string, made *[]placedLink) error {
	sdir, sname, err := openParentInRoot(rootFD, src)
	if err != nil {
		return err
	}
	defer sdir.Close()
	ddir, dname, err := openParentInRoot(rootFD, dst)
	if err != nil {
		return err
	}
	// No AT_SYMLINK_FOLLOW: a symlink at src is linked itself, not
	// followed.
	if err := unix.Linkat(int(sdir.Fd()), sname, int(ddir.Fd()), dname, 0); err != nil {
		ddir.Close()
		return &os.LinkError{Op: "linkat", Old: src, New: dst, Err: err}
	}
	*made = append(*made, placedLink{parent: ddir, name: dname})
	return nil
}

// openParentInRoot opens the directory holding p (a path inside the root
// rootFD) resolved in that root: "..", absolute symlinks and symlinks
// that climb stop at the root, as they do for the sandbox's own processes;
// magic links (/proc/self/...) and mount crossings are refused. The name
// is p's last component.
func openParentInRoot(rootFD int, p string) (*os.File, string, error) {
	p = path.Clean("/" + filepath.ToSlash(p))
	pdir, name := path.Split(p)
	if name == "" || name == "." || name == ".." {
		return nil, "", fmt.Errorf("%q names no file in the root", p)
	}
	fd, err := unix.Openat2(rootFD, "."+pdir, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, "", fmt.Errorf("open %s in the restore root: %w", pdir, err)
	}
	return os.NewFile(uintptr(fd), pdir), name, nil
}

// unplaceLinks removes what is left of the names placeLinks made (CRIU
// removes a link remap once it has opened it; a failed restore may not),
// each in the directory it was made in.
func unplaceLinks(made []placedLink) {
	for _, l := range made {
		unix.Unlinkat(int(l.parent.Fd()), l.name, 0)
		l.parent.Close()
	}
}
