package envpool

import "github.com/arbor-env/arbor/envpool/launch"

// Launcher boots environments from images; see launch.Launcher.
type Launcher = launch.Launcher

// Env is a sandbox booted by a Launcher; see launch.Env.
type Env = launch.Env

// VolumePrefix is where sandbox roots live in the snapshotter.
const VolumePrefix = launch.VolumePrefix

// NewID returns a fresh random environment id.
func NewID() string { return launch.NewID() }
