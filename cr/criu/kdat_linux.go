package criu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"golang.org/x/sys/unix"
)

// kdatPath is where CRIU caches what it learned about the kernel. CRIU only
// keeps the cache on a tmpfs, and without it every run spends ~60 ms probing
// the kernel again.
const kdatPath = "/run/criu.kdat"

// kdatShared is the tmpfs copy of the cache when /run is not a tmpfs.
const kdatShared = "/dev/shm/arbor-criu/criu.kdat"

// ensureKdatCache makes CRIU's kernel cache usable on hosts whose /run is
// not a tmpfs: CRIU is run once in a private mount namespace with a tmpfs
// on /run, the cache it writes is kept in /dev/shm (a tmpfs, cleared at
// boot like the cache must be) and /run/criu.kdat links to it. CRIU reads
// the cache through the link. Best effort: without it CRIU is only slower.
func ensureKdatCache(criu string) error {
	var st unix.Statfs_t
	if err := unix.Statfs("/run", &st); err != nil || st.Type == unix.TMPFS_MAGIC {
		return nil
	}
	if _, err := os.Stat(kdatPath); err == nil {
		return nil // a cache, or our link to one, is in place
	}
	if err := os.MkdirAll("/dev/shm/arbor-criu", 0o700); err != nil {
		return err
	}
	// A failed earlier attempt leaves a temporary file that makes CRIU
	// refuse to write the cache again.
	os.Remove(kdatPath + ".tmp")
	script := fmt.Sprintf(`mount -t tmpfs -o size=1m,mode=755 tmpfs /run && %q check >/dev/null 2>&1; cp /run/criu.kdat %q`, criu, kdatShared)
	// criu check takes well under a second; it must not hold New forever.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-m", "sh", "-c", script)
	cmd.WaitDelay = 5 * time.Second // a child still holding the output pipe
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build criu kernel cache: %v: %s", err, out)
	}
	os.Remove(kdatPath)
	if err := os.Symlink(kdatShared, kdatPath); err != nil {
		return fmt.Errorf("link criu kernel cache: %w", err)
	}
	return nil
}
