package image_test

import (
	"testing"

	"github.com/arbor-env/arbor/cr/zfs/zfstest"
)

// TestMain: the ZFS tests (names ending in ZFS, run by make test on their
// own) share one zfs-fuse pool, set up on first use.
func TestMain(m *testing.M) { zfstest.Main(m) }
