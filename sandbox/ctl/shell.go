package ctl

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Shell is the wire form of sandbox.ShellConfig: the persistent shell's
// environment, directory and credentials (Request.Shell). The zero value
// is the default shell: root, /root, init's default environment.
type Shell struct {
	// Env are KEY=VALUE pairs added to the default environment; a key
	// given here replaces the default's.
	Env []string `json:"env,omitempty"`
	// Dir is the absolute, clean directory the shell starts in ("": /root).
	Dir string `json:"dir,omitempty"`
	// UID, GID and Groups are the shell's credentials.
	UID    uint32   `json:"uid,omitempty"`
	GID    uint32   `json:"gid,omitempty"`
	Groups []uint32 `json:"groups,omitempty"`
}

// noID is (uid_t)-1, which set*id calls take for "leave unchanged".
const noID = ^uint32(0)

// Validate reports the first field that is not what init can start a
// shell with, naming it.
func (s Shell) Validate() error {
	if s.Dir != "" {
		switch {
		case strings.IndexByte(s.Dir, 0) >= 0:
			return fmt.Errorf("Dir %q: contains a NUL byte", s.Dir)
		case !path.IsAbs(s.Dir):
			return fmt.Errorf("Dir %q: not an absolute path", s.Dir)
		case path.Clean(s.Dir) != s.Dir:
			return fmt.Errorf("Dir %q: not a clean path (want %q)", s.Dir, path.Clean(s.Dir))
		}
	}
	for i, kv := range s.Env {
		k, _, ok := strings.Cut(kv, "=")
		switch {
		case strings.IndexByte(kv, 0) >= 0:
			return fmt.Errorf("Env[%d] %q: contains a NUL byte", i, kv)
		case !ok:
			return fmt.Errorf("Env[%d] %q: want KEY=VALUE", i, kv)
		case k == "":
			return fmt.Errorf("Env[%d] %q: empty key", i, kv)
		}
	}
	if s.UID == noID {
		return errors.New("UID 4294967295: not a valid id")
	}
	if s.GID == noID {
		return errors.New("GID 4294967295: not a valid id")
	}
	for i, g := range s.Groups {
		if g == noID {
			return fmt.Errorf("Groups[%d] 4294967295: not a valid id", i)
		}
	}
	return nil
}

// Root reports whether the shell runs with root's credentials as they are
// (uid 0, gid 0, no supplementary groups given).
func (s Shell) Root() bool { return s.UID == 0 && s.GID == 0 && len(s.Groups) == 0 }

// Equal reports whether s and o start the same shell.
func (s Shell) Equal(o Shell) bool {
	return s.Dir == o.Dir && s.UID == o.UID && s.GID == o.GID &&
		slices.Equal(s.Env, o.Env) && slices.Equal(s.Groups, o.Groups)
}
