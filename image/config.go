package image

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Config is what of an OCI image's config a sandbox uses (docs/images.md,
// "The image config in a sandbox"): the persistent shell starts with Env,
// in WorkingDir, as UID:GID with Groups. Entrypoint and Cmd are kept but
// not run (a sandbox runs Arbor's shell, not the image's program);
// exposed ports, volumes and health checks are ignored.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	// User is the config's user as written ("1000", "app:staff");
	// UID, GID and Groups are what it resolved to in the image's
	// /etc/passwd and /etc/group.
	User       string            `json:"user,omitempty"`
	UID        uint32            `json:"uid,omitempty"`
	GID        uint32            `json:"gid,omitempty"`
	Groups     []uint32          `json:"groups,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
}

// LabelOtherUsers is the image label ("true") that says programs of the
// image run as users other than the shell's: a daemon that drops to its
// own uid (PostgreSQL, Debian's redis). CRIU reads the resource limits of
// every task it dumps, which for a task of another uid needs
// CAP_SYS_RESOURCE; a launcher whose host lacks it starts such an image's
// sandboxes in user namespace mode, as it does for a non-root image user
// (docs/images.md, "The image config in a sandbox").
const LabelOtherUsers = "org.arbor.other-users"

// OtherUsers reports whether c carries LabelOtherUsers set to "true".
func (c *Config) OtherUsers() bool {
	return c != nil && c.Labels[LabelOtherUsers] == "true"
}

// configFrom takes the parts of an OCI config a sandbox uses, resolving
// its user in the tree at root: a user name or group the image does not
// define is an error (the image could not run as it says).
func configFrom(c *v1.ConfigFile, root string) (*Config, error) {
	if c == nil {
		return nil, nil
	}
	oc := c.Config
	out := &Config{Env: oc.Env, User: oc.User, Labels: oc.Labels, Entrypoint: oc.Entrypoint, Cmd: oc.Cmd}
	if oc.WorkingDir != "" {
		if !path.IsAbs(oc.WorkingDir) {
			return nil, fmt.Errorf("image config: working dir %q is not absolute", oc.WorkingDir)
		}
		out.WorkingDir = path.Clean(oc.WorkingDir)
	}
	for _, e := range oc.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" || strings.ContainsRune(e, 0) {
			return nil, fmt.Errorf("image config: env entry %q is not KEY=VALUE", e)
		}
	}
	if oc.User == "" {
		return out, nil
	}
	u, err := resolveUser(root, oc.User)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	out.UID, out.GID, out.Groups = u.uid, u.gid, u.groups
	if u.home != "" && !hasEnv(out.Env, "HOME") {
		out.Env = append(slices.Clone(out.Env), "HOME="+u.home)
	}
	return out, nil
}

func hasEnv(env []string, key string) bool {
	return slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, key+"=") })
}

type user struct {
	uid, gid uint32
	groups   []uint32
	home     string
}

// resolveUser resolves "user[:group]" (names or numbers) as runc does: a
// name must be in the image's /etc/passwd (a group name in /etc/group); a
// number need not be. The supplementary groups are those of /etc/group
// that list the user's name.
func resolveUser(root, spec string) (user, error) {
	uname, gname, hasGroup := strings.Cut(spec, ":")
	passwd, _ := readColonFile(root, "/etc/passwd")
	groups, _ := readColonFile(root, "/etc/group")
	var u user
	found := false
	if id, err := strconv.ParseUint(uname, 10, 32); err == nil {
		u.uid = uint32(id)
		for _, f := range passwd {
			if len(f) >= 6 && f[2] == uname {
				uname, found = f[0], true
				u.gid, u.home = parseID(f[3]), f[5]
				break
			}
		}
	} else {
		for _, f := range passwd {
			if len(f) >= 6 && f[0] == uname {
				u.uid, u.gid, u.home, found = parseID(f[2]), parseID(f[3]), f[5], true
				break
			}
		}
		if !found {
			return user{}, fmt.Errorf("user %q is not in the image's /etc/passwd", uname)
		}
	}
	if hasGroup {
		if id, err := strconv.ParseUint(gname, 10, 32); err == nil {
			u.gid = uint32(id)
		} else {
			ok := false
			for _, f := range groups {
				if len(f) >= 3 && f[0] == gname {
					u.gid, ok = parseID(f[2]), true
					break
				}
			}
			if !ok {
				return user{}, fmt.Errorf("group %q is not in the image's /etc/group", gname)
			}
		}
	}
	if found {
		for _, f := range groups {
			if len(f) >= 4 && slices.Contains(strings.Split(f[3], ","), uname) {
				if g := parseID(f[2]); g != u.gid && !slices.Contains(u.groups, g) {
					u.groups = append(u.groups, g)
				}
			}
		}
	}
	return u, nil
}

func parseID(s string) uint32 {
	n, _ := strconv.ParseUint(s, 10, 32)
	return uint32(n)
}

// readColonFile reads an /etc/passwd-like file of the tree at root (its
// path resolved inside root), one slice of fields per line.
func readColonFile(root, p string) ([][]string, error) {
	hp, err := resolveIn(root, p)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(hp)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out, sc.Err()
}
