package cr

import (
	"fmt"
	"strings"
)

// CheckName reports whether name is usable as a volume or snapshot name:
// a relative, slash-separated path of components made of letters, digits
// and "._-:", none of them "." or "..", and none starting with "." (the
// backends keep their own bookkeeping under dot names). The character set
// is what both btrfs paths and zfs dataset names accept.
func CheckName(name string) error {
	if name == "" {
		return fmt.Errorf("check name: empty: %w", ErrInvalidName)
	}
	for comp := range strings.SplitSeq(name, "/") {
		if comp == "" || comp[0] == '.' {
			return fmt.Errorf("check name %q: empty or dot component: %w", name, ErrInvalidName)
		}
		for _, c := range comp {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
				c == '.' || c == '_' || c == '-' || c == ':'
			if !ok {
				return fmt.Errorf("check name %q: character %q: %w", name, c, ErrInvalidName)
			}
		}
	}
	return nil
}
