package crtest

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/arbor-env/arbor/cr"
)

const mib = 1 << 20

// fill appends 1 MiB chunks of random data (so that no compression shrinks
// them) to path until a write fails or max bytes are written; it returns
// how much was written and the error that stopped it.
func fill(t testing.TB, path string, max int64) (int64, error) {
	t.Helper()
	chunk := make([]byte, mib)
	rand.Read(chunk)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	var n int64
	for n < max {
		m, err := f.Write(chunk)
		n += int64(m)
		if err != nil {
			f.Close()
			return n, err
		}
	}
	return n, f.Close()
}

func isQuotaErr(err error) bool {
	return errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.ENOSPC)
}

// testQuota: a clone with a quota refuses writes past it with EDQUOT; the
// cap counts what the clone writes, not what it shares with its source;
// Quota sees it full; a sibling and the pool are unaffected; a delete gives
// the room back unless a snapshot still holds the data; a clone of a
// snapshot of the full clone (a branched child) starts with the whole cap
// and stops at it too; a cap of 0 lifts it.
func testQuota(t *testing.T, s cr.Snapshotter) {
	q, ok := s.(cr.Quotaer)
	if !ok {
		t.Fatalf("%s backend does not implement cr.Quotaer", s.Backend())
	}
	ctx := t.Context()
	const base, limit = 8 * mib, 32 * mib
	must(t, s.CreateVolume(ctx, "vol"))
	if n, err := fill(t, filepath.Join(s.Path("vol"), "base"), base); err != nil {
		t.Fatalf("write base (%d bytes): %v", n, err)
	}
	must(t, s.Snapshot(ctx, "vol", "image"))
	must(t, s.Clone(ctx, "image", "c1"))
	must(t, s.Clone(ctx, "image", "c2"))
	must(t, q.SetQuota(ctx, "c1", limit))

	// fillToCap fills volume name to its cap and checks where it stopped:
	// the cap counts new data only (not the 8 MiB shared with the image),
	// less the file system's own overhead of a few MiB at most.
	fillToCap := func(name, file string) {
		t.Helper()
		n, err := fill(t, filepath.Join(s.Path(name), file), 2*limit)
		if !isQuotaErr(err) {
			t.Fatalf("%s: write %d bytes past a %d byte quota: want EDQUOT or ENOSPC, got %v", name, n, limit, err)
		}
		if n > limit || n < limit-4*mib {
			t.Fatalf("%s: wrote %d MiB into a clone with a %d MiB quota, want %d MiB or a little less", name, n/mib, limit/mib, limit/mib)
		}
		u, qerr := q.Quota(ctx, name)
		must(t, qerr)
		t.Logf("%s: stopped after %d bytes with %v; Quota: %+v", name, n, err, u)
		if u.Free >= 2*mib {
			t.Fatalf("%s: Quota of a full clone: %+v, want Free near 0", name, u)
		}
	}
	fillToCap("c1", "big")
	// The cap is c1's alone: its sibling takes more than c1's whole quota.
	if n, err := fill(t, filepath.Join(s.Path("c2"), "big"), limit+8*mib); err != nil {
		t.Fatalf("sibling of a full clone: wrote %d bytes: %v", n, err)
	}
	if u, err := q.Quota(ctx, "c2"); err != nil || u.Free < 8*mib {
		t.Fatalf("Quota of an uncapped clone: %+v, %v: want the pool's free space", u, err)
	}
	// Deleting gives the room back.
	must(t, os.Remove(filepath.Join(s.Path("c1"), "big")))
	if n, err := fill(t, filepath.Join(s.Path("c1"), "after-rm"), 4*mib); err != nil {
		t.Fatalf("write after deleting the file that filled the quota: %d bytes: %v", n, err)
	}
	must(t, os.Remove(filepath.Join(s.Path("c1"), "after-rm")))
	// ...unless a snapshot (a checkpoint) still holds it. (Not done at
	// the cap: zfs-fuse refuses even the unlink then, with EDQUOT.)
	if n, err := fill(t, filepath.Join(s.Path("c1"), "held"), limit/2); err != nil {
		t.Fatalf("write %d bytes: %v", n, err)
	}
	must(t, s.Snapshot(ctx, "c1", "state"))
	must(t, os.Remove(filepath.Join(s.Path("c1"), "held")))
	n, err := fill(t, filepath.Join(s.Path("c1"), "after-snapshot"), limit)
	if !isQuotaErr(err) || n > limit/2 || n < limit/2-4*mib {
		t.Fatalf("deleted %d MiB a snapshot holds: wrote %d MiB more, err %v; want about %d MiB and EDQUOT or ENOSPC",
			limit/2/mib, n/mib, err, limit/2/mib)
	}
	// A clone of that snapshot gets a whole cap of its own, and stops at it.
	must(t, s.Clone(ctx, "state", "child"))
	must(t, q.SetQuota(ctx, "child", limit))
	fillToCap("child", "more")
	// A cap of 0 lifts it.
	must(t, q.SetQuota(ctx, "c1", 0))
	if n, err := fill(t, filepath.Join(s.Path("c1"), "uncapped"), limit); err != nil {
		t.Fatalf("write %d MiB after lifting the quota: %d bytes: %v", limit/mib, n, err)
	}
	if err := q.SetQuota(ctx, "missing", limit); !errors.Is(err, cr.ErrNotFound) {
		t.Fatalf("SetQuota of a missing volume: want ErrNotFound, got %v", err)
	}
	must(t, s.Destroy(ctx, "child"))
	must(t, s.Destroy(ctx, "state"))
	must(t, s.Destroy(ctx, "c1"))
}
