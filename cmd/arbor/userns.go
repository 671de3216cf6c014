package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/arbor-env/arbor/sandbox"
)

// userNSFlags are --userns and --userns-range (docs/sandbox.md, "User
// namespace mode").
type userNSFlags struct {
	on  bool
	rng string
}

func (u *userNSFlags) add(f *pflag.FlagSet) {
	f.BoolVar(&u.on, "userns", envOr("ARBOR_USERNS", "") == "1", "run sandboxes in user namespace mode: root inside is an unprivileged host id (env ARBOR_USERNS=1)")
	f.StringVar(&u.rng, "userns-range", envOr("ARBOR_USERNS_RANGE", fmt.Sprintf("%d:%d", sandbox.DefaultUserNSHostID, sandbox.DefaultUserNSSize)),
		"host ids the sandbox ids 0..SIZE-1 map to, as FIRST:SIZE; images are shifted once to it")
}

// config parses the flags.
func (u *userNSFlags) config() (sandbox.UserNSConfig, error) {
	if !u.on {
		return sandbox.UserNSConfig{}, nil
	}
	first, size, ok := strings.Cut(u.rng, ":")
	h, err := strconv.ParseUint(first, 10, 32)
	if err != nil || !ok {
		return sandbox.UserNSConfig{}, fmt.Errorf("parse --userns-range %q: want FIRST:SIZE", u.rng)
	}
	n, err := strconv.ParseUint(size, 10, 32)
	if err != nil || n == 0 || h == 0 || h+n > 1<<32-1 {
		return sandbox.UserNSConfig{}, fmt.Errorf("parse --userns-range %q: want FIRST:SIZE, FIRST > 0, SIZE > 0, within 32 bits", u.rng)
	}
	return sandbox.UserNSConfig{Enabled: true, HostID: uint32(h), Size: uint32(n)}, nil
}
