package image

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Shift moves the ownership of every file below root (one file system, not
// following symlinks) from ids 0..size-1 to base..base+size-1, the range a
// sandbox in user namespace mode maps its ids to (docs/sandbox.md, "User
// namespace mode"). Ids already in the range are left alone, so hard links
// and an interrupted earlier run are fine; an id outside both is an error.
// chown clears set-id bits and file capabilities, so both are put back;
// capabilities are rewritten as version 3 with the range's root as their
// root id, the only form the kernel honours inside that namespace.
func Shift(root string, base, size uint32) error {
	var rst unix.Stat_t
	if err := unix.Lstat(root, &rst); err != nil {
		return fmt.Errorf("stat %s: %w", root, err)
	}
	in := func(id uint32) bool { return id >= base && id-base < size }
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if st.Dev != rst.Dev {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		uid, gid := st.Uid, st.Gid
		if !in(uid) {
			if uid >= size {
				return fmt.Errorf("shift %s: uid %d is outside 0..%d", p, uid, size-1)
			}
			uid += base
		}
		if !in(gid) {
			if gid >= size {
				return fmt.Errorf("shift %s: gid %d is outside 0..%d", p, gid, size-1)
			}
			gid += base
		}
		if uid == st.Uid && gid == st.Gid {
			return nil
		}
		regular := st.Mode&unix.S_IFMT == unix.S_IFREG
		var caps []byte
		if regular {
			caps, err = getCaps(p)
			if err != nil {
				return err
			}
		}
		if err := unix.Lchown(p, int(uid), int(gid)); err != nil {
			return fmt.Errorf("chown %s: %w", p, err)
		}
		if regular && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			if err := unix.Chmod(p, st.Mode&0o7777); err != nil {
				return fmt.Errorf("restore mode of %s: %w", p, err)
			}
		}
		if caps != nil {
			if err := unix.Setxattr(p, capXattr, capsV3(caps, base), 0); err != nil {
				return fmt.Errorf("restore capabilities of %s: %w", p, err)
			}
		}
		return nil
	})
}

const capXattr = "security.capability"

func getCaps(p string) ([]byte, error) {
	buf := make([]byte, 64)
	n, err := unix.Getxattr(p, capXattr, buf)
	if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read capabilities of %s: %w", p, err)
	}
	return buf[:n], nil
}

// capsV3 turns a v2 or v3 vfs_cap_data into v3 with rootid (struct
// vfs_ns_cap_data: magic_etc, two {permitted, inheritable} pairs, rootid).
func capsV3(c []byte, rootid uint32) []byte {
	const v3 = 0x03000000
	out := make([]byte, 24)
	copy(out, c)
	flags := binary.LittleEndian.Uint32(c) & 0x1 // VFS_CAP_FLAGS_EFFECTIVE
	binary.LittleEndian.PutUint32(out[0:], v3|flags)
	binary.LittleEndian.PutUint32(out[20:], rootid)
	return out
}
