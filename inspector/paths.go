package inspector

import "strings"

// notInSnapshots are sandbox paths that are mounts of their own, whose
// contents no filesystem artifact holds.
var notInSnapshots = []string{"/proc", "/dev/pts"}

// SnapshotPath returns p, without empty or "." components or a trailing slash,
// unless it lies in a mount no snapshot holds. ".." stays: only a walk
// through the tree can tell what it means after a symlink.
func SnapshotPath(p string) []string {
	parts := strings.Split(p, "/")
	out := parts[:0]
	for _, c := range parts {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	p = "/" + strings.Join(out, "/")
	for _, m := range notInSnapshots {
		if p == m || strings.HasPrefix(p, m+"/") {
			return nil
		}
	}
	return []string{p}
}
