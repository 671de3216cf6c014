package criu

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
)

// What of a failed CRIU run is the sandbox's own doing (docs/protocol.md,
// Errors: env_error). CRIU says why it failed in its log only; these rules
// read it. They are kept narrow: a failure they do not name stays the
// server's (checkpoint_failed, restore_failed), so that no failure of
// Arbor is ever scored as the agent's.

// DefaultGhostLimit is the largest deleted file a process of the sandbox
// may hold open for a dump to succeed, when Checkpointer.GhostLimit is
// zero. CRIU copies such a file's contents into the image (a "ghost");
// its own default, 1 MiB, made one ordinary command (a 2 MiB scratch file
// held open and removed) fail every later checkpoint. 64 MiB keeps what a
// single held file may add to an image, and to a restore's root, bounded.
const DefaultGhostLimit = 64 << 20

// ghostOverLimit is CRIU's log line for a deleted file over the ghost
// limit (criu/files-reg.c): "Can't dump ghost file /tmp/g of 2097152
// size, increase limit".
var ghostOverLimit = regexp.MustCompile(`Can't dump ghost file (.*) of (\d+) size, increase limit`)

// dumpFilesOf is CRIU's log line naming the task whose files it failed to
// dump (criu/cr-dump.c): "Dump files (pid: 15181) failed with -1".
var dumpFilesOf = regexp.MustCompile(`Dump files \(pid: (\d+)\) failed`)

// ghostFailure is a dump's failure on a held deleted file over the limit,
// as its log tells it: the file's path inside the sandbox, its size and
// the host pid of the task that holds it (0 when the log does not say).
type ghostFailure struct {
	path string
	size int64
	pid  int
}

// parseGhostFailure finds a ghost over the limit in a dump's log.
func parseGhostFailure(log []byte) (ghostFailure, bool) {
	var g ghostFailure
	for _, l := range bytes.Split(log, []byte("\n")) {
		if m := ghostOverLimit.FindSubmatch(l); m != nil && g.path == "" {
			g.path = string(m[1])
			g.size, _ = strconv.ParseInt(string(m[2]), 10, 64)
		}
		if m := dumpFilesOf.FindSubmatch(l); m != nil && g.pid == 0 {
			g.pid, _ = strconv.Atoi(string(m[1]))
		}
	}
	return g, g.path != ""
}

// quotaInRestore reports whether a restore's log says a write into the
// restored root hit the sandbox's disk quota (EDQUOT): CRIU writes the
// ghosts of held deleted files back into the root, which counts against
// the sandbox's own quota. A full pool (ENOSPC) is the server's, not this.
func quotaInRestore(log []byte) bool {
	return bytes.Contains(log, []byte("Disk quota exceeded"))
}

// ghostDirNotDir is CRIU's log line for a held deleted file whose ghost
// cannot be made where the file was named, because a component of that
// path is no longer a directory (criu/files-reg.c): "Can't create ghost
// regfile: Not a directory". Only a process of the sandbox can have put a
// file there: the agent replaced the directory of a file it holds.
var ghostDirNotDir = []byte("Can't create ghost regfile: Not a directory")

// ghostPathBlocked reports whether a restore's log says so.
func ghostPathBlocked(log []byte) bool { return bytes.Contains(log, ghostDirNotDir) }

// mib formats a byte count for a message.
func mib(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}
