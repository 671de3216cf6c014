package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// What the agent can break of its own sandbox while init runs on, told
// apart from failures of the server (docs/protocol.md, Errors: env_error):
// everything in the sandbox's root is the agent's to remove, the shell's
// binary included (the control channel is in no file tree: package ctl).
// The rules are narrow: a failure they do not name stays an
// infrastructure error.

// alive reports whether init has not exited.
func (s *Sandbox) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// shellBroken returns an error wrapping ErrBroken when init could not
// start a shell (why, from init) because the shell's binary (path, inside
// the sandbox) is gone or cannot be run: a shell ran from it before, so
// something inside the sandbox removed or changed it. Otherwise nil.
func (s *Sandbox) shellBroken(path, why string) error {
	if path == "" || !s.alive() {
		return nil
	}
	gone := s.binaryGone(path)
	if gone == "" {
		// It is there and executable; init's exec may still have refused
		// it for what it holds (a text file without #!, a binary of
		// another kind).
		for _, e := range []error{syscall.ENOEXEC, syscall.EACCES, syscall.ENOENT} {
			if strings.Contains(why, e.Error()) {
				gone = "cannot be run (" + e.Error() + ")"
			}
		}
	}
	if gone == "" {
		return nil
	}
	return fmt.Errorf("%w: the shell %s %s, changed by a process inside the sandbox: no shell can start, so this sandbox runs no more commands (init: %s)",
		ErrBroken, path, gone, why)
}

// binaryGone says what is wrong with the executable at path inside the
// sandbox's root ("" when it is a regular file with an execute bit),
// resolved in that root as the sandbox's processes see it.
func (s *Sandbox) binaryGone(path string) string {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", s.pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, strings.TrimPrefix(path, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.ENOENT):
		return "is gone"
	case err != nil:
		return ""
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return ""
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
		return "is no longer an executable file"
	}
	return ""
}
