package btrfs

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ioctl numbers and layouts from linux/btrfs.h (checked against the
// header with a C program: the vol_args structs are 4096 bytes, the subvol
// info struct 504, fs_info 1024 with the fsid at offset 16, quota_ctl 16,
// qgroup_limit 48, qgroup_create 16, search_key 104, search_args 4096).
const (
	iocSubvolCreate      = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	iocSnapDestroy       = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	iocSnapCreateV2      = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	iocGetSubvolInfo     = 0x81f8943c // _IOR(0x94, 60, struct btrfs_ioctl_get_subvol_info_args)
	iocFSInfo            = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	iocQuotaCtl          = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	iocQgroupLimit       = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	iocQgroupCreate      = 0x4010942a // _IOW(0x94, 42, struct btrfs_ioctl_qgroup_create_args)
	iocTreeSearch        = 0xd0009411 // _IOWR(0x94, 17, struct btrfs_ioctl_search_args)
	iocSync              = 0x00009408 // _IO(0x94, 8)
	rootTreeObjectID     = 1          // BTRFS_ROOT_TREE_OBJECTID
	rootItemKey          = 132        // BTRFS_ROOT_ITEM_KEY
	orphanObjectID       = ^uint64(4) // BTRFS_ORPHAN_OBJECTID (-5ULL)
	orphanItemKey        = 48         // BTRFS_ORPHAN_ITEM_KEY
	searchHeaderSize     = 32         // struct btrfs_ioctl_search_header, before each item
	quotaCtlEnableSimple = 4          // BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA (Linux 6.7)
	qgroupLimitMaxRfer   = 1 << 0     // BTRFS_QGROUP_LIMIT_MAX_RFER
	qgroupLimitClear     = ^uint64(0) // CLEAR_VALUE: a limit of this value removes it
	subvolRdonly         = 1 << 1     // BTRFS_SUBVOL_RDONLY, for SNAP_CREATE_V2
	rootSubvolRdonly     = 1 << 0     // BTRFS_ROOT_SUBVOL_RDONLY, in subvolInfo.flags
	firstFreeObjectID    = 256        // inode number of every subvolume's root directory
	superMagic           = 0x9123683e // BTRFS_SUPER_MAGIC
)

type volArgs struct {
	fd   int64
	name [4088]byte
}

type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

type subvolInfo struct {
	treeid     uint64
	name       [256]byte
	parentID   uint64
	dirid      uint64
	generation uint64
	flags      uint64
	uuid       [16]byte
	parentUUID [16]byte
	rest       [504 - 328]byte
}

type fsInfo struct {
	maxID      uint64
	numDevices uint64
	fsid       [16]byte
	rest       [1024 - 32]byte
}

type quotaCtlArgs struct {
	cmd    uint64
	status uint64
}

type qgroupCreateArgs struct {
	create   uint64 // 0: remove
	qgroupID uint64
}

// searchKey and searchArgs are btrfs_ioctl_search_key and
// btrfs_ioctl_search_args: which items of which tree to return, and the
// buffer they come back in.
type searchKey struct {
	treeID                   uint64
	minObjectID, maxObjectID uint64
	minOffset, maxOffset     uint64
	minTransID, maxTransID   uint64
	minType, maxType         uint32
	nrItems                  uint32
	_                        uint32
	_                        [4]uint64
}

type searchArgs struct {
	key searchKey
	buf [4096 - 104]byte
}

// qgroupLimitArgs is btrfs_ioctl_qgroup_limit_args: a qgroup id (0: the
// subvolume the ioctl is called on) and a struct btrfs_qgroup_limit.
type qgroupLimitArgs struct {
	qgroupID uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

func setName(dst []byte, name string) error {
	if len(name) >= len(dst) {
		return fmt.Errorf("name %q too long", name)
	}
	copy(dst, name)
	return nil
}

// createSubvol makes an empty subvolume called name in directory parent.
func createSubvol(parent, name string) error { return nameIoctl(parent, name, iocSubvolCreate) }

// destroySubvol deletes the subvolume called name in directory parent.
func destroySubvol(parent, name string) error { return nameIoctl(parent, name, iocSnapDestroy) }

// nameIoctl runs req, whose argument names a subvolume, on directory
// parent.
func nameIoctl(parent, name string, req uintptr) error {
	dfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	var a volArgs
	if err := setName(a.name[:], name); err != nil {
		return err
	}
	return ioctl(dfd, req, unsafe.Pointer(&a))
}

// snapshotSubvol snapshots the subvolume at src as name in directory parent.
func snapshotSubvol(src, parent, name string, readOnly bool) error {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	dfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	a := volArgsV2{fd: int64(sfd)}
	if readOnly {
		a.flags = subvolRdonly
	}
	if err := setName(a.name[:], name); err != nil {
		return err
	}
	return ioctl(dfd, iocSnapCreateV2, unsafe.Pointer(&a))
}

// getSubvolInfo reads the flags and uuids of the subvolume at path.
func getSubvolInfo(path string) (*subvolInfo, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var info subvolInfo
	if err := ioctl(fd, iocGetSubvolInfo, unsafe.Pointer(&info)); err != nil {
		return nil, err
	}
	return &info, nil
}

// isSubvol reports whether path is the root of a subvolume; exists is false
// when nothing is at path.
func isSubvol(path string) (subvol, exists bool, err error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if err == unix.ENOENT || err == unix.ENOTDIR {
			return false, false, nil
		}
		return false, false, err
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Ino == firstFreeObjectID, true, nil
}

func onBtrfs(path string) (bool, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return false, err
	}
	return uint32(fs.Type) == superMagic, nil
}
