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

// testQuota: a clone with a quota refuses writes past it with EDQUOT, the
// cap counts the data the clone shares with its source, Quota sees it
// full, a sibling clone and the pool are unaffected, a delete makes room
// again and a cap of 0 lifts it.
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

	big := filepath.Join(s.Path("c1"), "big")
	n, err := fill(t, big, 2*limit)
	if !isQuotaErr(err) {
		t.Fatalf("write %d bytes past a %d byte quota: want EDQUOT or ENOSPC, got %v", n, limit, err)
	}
	// The 8 MiB shared with the image count: no more than limit-base fits,
	// and the file system's own overhead takes no more than a few MiB.
	if n > limit-base || n < limit-base-4*mib {
		t.Fatalf("wrote %d MiB into a clone of an %d MiB image with a %d MiB quota, want %d MiB or a little less",
			n/mib, base/mib, limit/mib, (limit-base)/mib)
	}
	u, qerr := q.Quota(ctx, "c1")
	must(t, qerr)
	t.Logf("stopped after %d bytes with %v; Quota: %+v", n, err, u)
	if u.Free >= 2*mib || u.Used < limit-2*mib {
		t.Fatalf("Quota of a full clone: %+v, want Used near %d and Free near 0", u, limit)
	}
	// The cap is c1's alone: its sibling takes more than c1's whole quota.
	if n, err := fill(t, filepath.Join(s.Path("c2"), "big"), limit+8*mib); err != nil {
		t.Fatalf("sibling of a full clone: wrote %d bytes: %v", n, err)
	}
	if u, err := q.Quota(ctx, "c2"); err != nil || u.Free < 8*mib {
		t.Fatalf("Quota of an uncapped clone: %+v, %v: want the pool's free space", u, err)
	}
	// A clone of a snapshot of the full clone (a branch of a full
	// sandbox) takes the same cap and is full from the start.
	must(t, s.Snapshot(ctx, "c1", "full"))
	must(t, s.Clone(ctx, "full", "c3"))
	must(t, q.SetQuota(ctx, "c3", limit))
	if n, err := fill(t, filepath.Join(s.Path("c3"), "more"), 4*mib); !isQuotaErr(err) {
		t.Fatalf("clone of a full clone: wrote %d bytes, err %v: want EDQUOT or ENOSPC", n, err)
	}
	// Deleting makes room again.
	must(t, os.Remove(big))
	if n, err := fill(t, filepath.Join(s.Path("c1"), "after-rm"), 4*mib); err != nil {
		t.Fatalf("write after deleting the file that filled the quota: %d bytes: %v", n, err)
	}
	// A cap of 0 lifts it.
	must(t, q.SetQuota(ctx, "c1", 0))
	if n, err := fill(t, filepath.Join(s.Path("c1"), "uncapped"), limit); err != nil {
		t.Fatalf("write %d MiB after lifting the quota: %d bytes: %v", limit/mib, n, err)
	}
	if err := q.SetQuota(ctx, "missing", limit); !errors.Is(err, cr.ErrNotFound) {
		t.Fatalf("SetQuota of a missing volume: want ErrNotFound, got %v", err)
	}
	must(t, s.Destroy(ctx, "c1"))
}
