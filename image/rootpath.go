package image

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// errTooManyLinks is returned when resolving a path meets a symlink loop.
var errTooManyLinks = errors.New("too many levels of symbolic links")

// resolveIn maps the absolute in-image path p onto the host path it names
// inside the tree at root, following symlinks as a chroot into root would:
// absolute targets and ".." resolve against root and never leave it. A
// missing final component is fine (the result names where it would be).
func resolveIn(root, p string) (string, error) {
	rest := strings.Split(strings.TrimPrefix(path.Clean("/"+p), "/"), "/")
	cur := "/" // resolved in-image path so far, with no symlinks in it
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		st, err := os.Lstat(filepath.Join(root, next))
		if err != nil || st.Mode()&os.ModeSymlink == 0 {
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return "", fmt.Errorf("resolve %s: %w", p, err)
			}
			cur = next
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("resolve %s: %w", p, errTooManyLinks)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", fmt.Errorf("resolve %s: %w", p, err)
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return filepath.Join(root, cur), nil
}
