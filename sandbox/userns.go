package sandbox

import "fmt"

// UserNSConfig turns on user namespace mode (docs/sandbox.md, "User
// namespace mode"): the sandbox gets its own user namespace in which uid and
// gid 0..Size-1 are host ids HostID..HostID+Size-1, so root inside is an
// unprivileged id on the host. The root file system must already be owned by
// that range (image.Store.Shifted makes such images); the netns stays owned
// by the host's user namespace, so a restored child and a started sandbox
// see the same network namespace ownership.
type UserNSConfig struct {
	Enabled bool
	// HostID is the first host uid and gid of the range (DefaultUserNSHostID
	// when zero).
	HostID uint32
	// Size is the number of ids mapped (DefaultUserNSSize when zero).
	Size uint32
}

// DefaultUserNSHostID is the first host id of the default range: 2^30,
// above the sub-id ranges useradd hands out (SUB_UID_MAX 600100000) and
// below 2^31, where some tools mistake ids for negative numbers.
const DefaultUserNSHostID = 1 << 30

// DefaultUserNSSize maps the 65536 ids images use (0..65535, nobody is
// 65534).
const DefaultUserNSSize = 65536

// WithDefaults fills zero fields of an enabled config.
func (u UserNSConfig) WithDefaults() UserNSConfig {
	if !u.Enabled {
		return UserNSConfig{}
	}
	if u.HostID == 0 {
		u.HostID = DefaultUserNSHostID
	}
	if u.Size == 0 {
		u.Size = DefaultUserNSSize
	}
	return u
}

// UIDMap is the uid_map line the sandbox's processes see ("0 HOST SIZE"),
// empty when the mode is off.
func (u UserNSConfig) UIDMap() string {
	if !u.Enabled {
		return ""
	}
	u = u.WithDefaults()
	return fmt.Sprintf("0 %d %d", u.HostID, u.Size)
}

func (u UserNSConfig) String() string {
	if !u.Enabled {
		return "off"
	}
	u = u.WithDefaults()
	return fmt.Sprintf("0-%d -> host %d-%d", u.Size-1, u.HostID, u.HostID+u.Size-1)
}

// UserNS is the sandbox's user namespace mode (with defaults filled in).
func (s *Sandbox) UserNS() UserNSConfig { return s.cfg.UserNS }
