package inspector

import "errors"

// ErrStalled is returned by the file-tree comparisons (PathChanged,
// TreeDiff) when their context ended while a system call was still
// blocked: the file system stopped answering (a FUSE daemon such as
// zfs-fuse that hangs), and the comparison was given up rather than the
// turn waiting for it forever.
var ErrStalled = errors.New("file system did not answer")
