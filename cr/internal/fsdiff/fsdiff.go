// Package fsdiff compares two directory trees path by path. It is the shared
// rule that decides whether a path counts as changed between a snapshot
// and a later volume, used by every snapshot backend so that they report the
// same changes: cr/btrfs asks it about the candidate paths of a send stream,
// cr/zfs walks whole trees with it.
//
// A path is Modified when, on both sides, it differs in file type, inode
// number (it was replaced), permission bits, owner, group, device number,
// symlink target, extended attributes, or, for non-directories, size or
// mtime. Access times and ctime alone never count, and neither does a
// directory's mtime: the entries that changed inside it are reported
// themselves. File content is not read, so a rewrite that keeps size and
// mtime is not seen by a walk (backends with a change stream force such
// paths to Modified).
package fsdiff
