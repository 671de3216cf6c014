package router_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/cluster/etcdtest"
)

// busybox's counter: a shell loop whose memory holds n, reported through
// a file when asked (as branch's tests do).
const (
	counterStart = `(n=0; while :; do if [ -e /tmp/ask ]; then n=$((n+1)); echo $n > /tmp/answer; rm /tmp/ask; fi; sleep 0.02; done) >/dev/null 2>&1 &`
	counterRead  = `rm -f /tmp/answer; touch /tmp/ask; while [ ! -s /tmp/answer ]; do sleep 0.02; done; cat /tmp/answer`
	shellState   = `echo "cwd=$(pwd) K=$K"; f; cat /work/file`
)

func fsPart(st branch.TransferStats) (int64, string) {
	for _, p := range st.Parts {
		if p.Kind == "fs" {
			return p.Bytes, p.Base
		}
	}
	return 0, ""
}

// postImport sends a raw stream to a node's import route.
func postImport(t *testing.T, addr string, b []byte) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+cluster.TransferPrefix+"import", "application/octet-stream", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg)
}

// TestShipState ships states of node a (127.0.0.2) to node b (127.0.0.3),
// each a real engine on its own btrfs pool, over the nodes' transfer
// routes: the first whole, the next as the difference from the first's
// snapshot; each is restored on b with its files, shell variables and
// the memory of a background process, and b is recorded as a holder in
// etcd. A damaged or cut stream is refused and leaves nothing on b.
func TestShipState(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcdClient(t, etcd)
	a := startNode(t, etcd, "a", "127.0.0.2")
	b := startNode(t, etcd, "b", "127.0.0.3")
	ctx := context.Background()
	ca := dial(t, a.addr)
	cb := dial(t, b.addr)
	r, err := ca.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	sh(t, ca, env, "mkdir -p /work && cd /work && export K=v && f() { echo fun; } && echo data > /work/file")
	sh(t, ca, env, counterStart)
	base, err := strconv.Atoi(out(sh(t, ca, env, counterRead)))
	if err != nil {
		t.Fatal(err)
	}
	s1, err := ca.Checkpoint(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	ship := cluster.NewShipClient("", time.Minute)
	st1, err := ship.Ship(ctx, a.addr, b.addr, s1)
	if err != nil {
		t.Fatal(err)
	}
	full, fbase := fsPart(st1)
	t.Logf("s1 whole: stream %d bytes, file snapshot %d, in %v", st1.Bytes, full, st1.Took)
	if fbase != "" || full == 0 {
		t.Errorf("first shipment's snapshot: %d bytes against %q, want a whole one", full, fbase)
	}
	if n := keysOf(t, cli, cluster.StateKey(s1, ""), b.id); n != 1 {
		t.Errorf("etcd holders of %s: node b recorded %d times, want 1", s1, n)
	}
	check := func(sid, file string, k int) {
		t.Helper()
		br, err := cb.Branch(ctx, arbor.BranchParams{StateID: sid, N: 1})
		if err != nil {
			t.Fatalf("branch %s on node b: %v", sid, err)
		}
		kid := br.EnvIDs[0]
		defer cb.CloseEnv(ctx, kid)
		if got := string(sh(t, cb, kid, shellState).Obs.Stdout); got != "cwd=/work K=v\nfun\n"+file {
			t.Errorf("%s on node b: %q", sid, got)
		}
		if got := out(sh(t, cb, kid, counterRead)); got != strconv.Itoa(base+k) {
			t.Errorf("%s on node b: counter %s, want %d (the process's memory)", sid, got, base+k)
		}
	}
	check(s1, "data\n", 1)

	sh(t, ca, env, "echo more >> /work/file; "+counterRead+" >/dev/null")
	s2, err := ca.Checkpoint(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	// The same state as a raw whole stream, damaged and cut: refused.
	var whole bytes.Buffer
	wst, err := a.eng.Export(ctx, s2, nil, &whole)
	if err != nil {
		t.Fatal(err)
	}
	wholeFS, _ := fsPart(wst)
	for _, tt := range []struct {
		name string
		b    []byte
	}{
		{"flipped byte", func() []byte { c := bytes.Clone(whole.Bytes()); c[len(c)/2] ^= 1; return c }()},
		// Inside the process image's tar, which only the checksum
		// guards: everything is read, then refused.
		{"flipped byte in the image", func() []byte { c := bytes.Clone(whole.Bytes()); c[len(c)-200000] ^= 1; return c }()},
		{"cut short", whole.Bytes()[:whole.Len()*2/3]},
		{"no checksum", whole.Bytes()[:whole.Len()-32]},
	} {
		code, msg := postImport(t, b.addr, tt.b)
		t.Logf("%s: %d %s", tt.name, code, strings.TrimSpace(msg))
		if code != http.StatusBadRequest || !strings.Contains(msg, "state transfer failed") {
			t.Errorf("%s: answered %d %q, want 400 state transfer failed", tt.name, code, msg)
		}
		offer, _ := a.eng.Offer(s2)
		if h := b.eng.Holds(offer); h.State || len(h.Artifacts) != 1 {
			t.Errorf("%s: node b holds %+v, want only s1's snapshot", tt.name, h)
		}
		if err := b.eng.CheckManifest(); err != nil {
			t.Errorf("%s: node b's manifest: %v", tt.name, err)
		}
	}
	st2, err := ship.Ship(ctx, a.addr, b.addr, s2)
	if err != nil {
		t.Fatal(err)
	}
	incr, ibase := fsPart(st2)
	t.Logf("s2 against s1: stream %d bytes, file snapshot %d (whole: %d), in %v", st2.Bytes, incr, wholeFS, st2.Took)
	if s1st, _ := a.eng.State(s1); ibase != s1st.FS {
		t.Errorf("s2's snapshot sent against %q, want s1's %s", ibase, s1st.FS)
	}
	if incr == 0 || incr*10 > wholeFS {
		t.Errorf("incremental snapshot %d bytes, want under a tenth of the whole %d", incr, wholeFS)
	}
	check(s2, "data\nmore\n", 2)
	again, err := ship.Ship(ctx, a.addr, b.addr, s2)
	if err != nil || !again.Held || again.Bytes != 0 {
		t.Errorf("shipping s2 again: %+v %v, want held, nothing sent", again, err)
	}
	if _, err := ship.Ship(ctx, a.addr, b.addr, "snope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("shipping an unknown state: %v, want 404", err)
	}
}
