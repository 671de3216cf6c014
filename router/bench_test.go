package router_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/server/protocol"
)

// quantiles returns the p50 and p99 of d.
func quantiles(d []time.Duration) (p50, p99 time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2], d[min(len(d)-1, len(d)*99/100)]
}

// BenchmarkRouterOverhead measures a step's round trip directly to its
// node and through the router (both on loopback, the router on
// 127.0.0.1, the node on 127.0.0.2), in alternating rounds so that both
// see the same machine: `true` takes no checkpoint (the path alone), a
// write makes a state each (a checkpoint, and its key in etcd). Reported
// as p50/p99 per path and what the router adds.
func BenchmarkRouterOverhead(b *testing.B) {
	etcd := etcdtest.Start(b)
	a := startNode(b, etcd, "a", "127.0.0.2")
	_, addr := startRouter(b, etcd)
	ctx := context.Background()
	direct := dial(b, a.addr)
	routed := dial(b, addr)
	r, err := routed.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cmd  string
		n    int
	}{{"noop", "true", 400}, {"state", "date > f", 60}} {
		b.Run(tc.name, func(b *testing.B) {
			var ds, rs []time.Duration
			step := func(c *arbor.Client, into *[]time.Duration) {
				start := time.Now()
				if _, err := c.Step(ctx, r.EnvID, arbor.Bash(tc.cmd, 0)); err != nil {
					b.Fatal(err)
				}
				*into = append(*into, time.Since(start))
			}
			for range max(b.N, 1) {
				for i := 0; i < tc.n; i += 10 {
					for range 10 {
						step(direct, &ds)
					}
					for range 10 {
						step(routed, &rs)
					}
				}
			}
			d50, d99 := quantiles(ds)
			r50, r99 := quantiles(rs)
			b.ReportMetric(float64(d50.Microseconds()), "direct-p50-us")
			b.ReportMetric(float64(d99.Microseconds()), "direct-p99-us")
			b.ReportMetric(float64(r50.Microseconds()), "router-p50-us")
			b.ReportMetric(float64(r99.Microseconds()), "router-p99-us")
			b.Logf("%s: %d steps each: direct p50 %v p99 %v; router p50 %v p99 %v; the router adds %v at p50, %v at p99",
				tc.name, len(ds), d50, d99, r50, r99, r50-d50, r99-d99)
		})
	}
}

// BenchmarkMigrate migrates a busybox env back and forth between two
// nodes through the router, by the size of what it wrote (a file in its
// root, and as much in a background process's memory), with a request
// counter in that process checked after every move: the pause (the env
// answers nothing) and the whole migration, and the bytes shipped before
// and during the pause.
func BenchmarkMigrate(b *testing.B) {
	etcd := etcdtest.Start(b)
	startNode(b, etcd, "a", "127.0.0.2")
	startNode(b, etcd, "b", "127.0.0.3")
	_, addr := startRouter(b, etcd)
	ctx := context.Background()
	c := dial(b, addr)
	for _, size := range []string{"0MiB", "16MiB", "64MiB", "debian"} {
		b.Run(size, func(b *testing.B) {
			img, mib, read := "busybox", 0, counterRead
			if size == "debian" {
				img = "debian"
			} else {
				mib, _ = strconv.Atoi(strings.TrimSuffix(size, "MiB"))
			}
			r, err := c.Reset(ctx, arbor.ResetParams{Image: img})
			if err != nil {
				b.Fatal(err)
			}
			env := r.EnvID
			defer c.CloseEnv(ctx, env)
			if img == "debian" {
				// A Python server holding a request counter in memory.
				sh(b, c, env, debianCounterStart)
				read = debianCounterRead
			} else {
				sh(b, c, env, fmt.Sprintf("mkdir -p /work; head -c %d /dev/urandom > /work/blob", mib<<20))
				// The counter's shell holds mib MiB in a variable.
				sh(b, c, env, fmt.Sprintf(`(big=$(head -c %d /dev/zero | tr '\0' x); n=0; while :; do if [ -e /tmp/ask ]; then n=$((n+1)); echo $n > /tmp/answer; rm /tmp/ask; fi; sleep 0.02; done) >/dev/null 2>&1 &`, mib<<20))
			}
			want, err := strconv.Atoi(out(sh(b, c, env, read)))
			if err != nil {
				b.Fatal(err)
			}
			var pause, total []time.Duration
			var pre, during int64
			for range max(b.N, 3) {
				var res protocol.MigrateResult
				if err := c.Call(ctx, protocol.MethodMigrate, protocol.MigrateParams{EnvID: env}, &res); err != nil {
					b.Fatal(err)
				}
				pause = append(pause, time.Duration(res.PauseS*float64(time.Second)))
				total = append(total, time.Duration(res.TookS*float64(time.Second)))
				pre, during = pre+res.PreBytes, during+res.Bytes
				want++
				if got := out(sh(b, c, env, read)); got != strconv.Itoa(want) {
					b.Fatalf("counter after a migration: %s, want %d", got, want)
				}
				// A turn between moves, as in an episode.
				sh(b, c, env, "mkdir -p /work; date >> /work/log")
			}
			p50, pmax := quantiles(pause)
			t50, tmax := quantiles(total)
			n := int64(len(pause))
			b.ReportMetric(float64(p50.Milliseconds()), "pause-p50-ms")
			b.ReportMetric(float64(t50.Milliseconds()), "total-p50-ms")
			b.Logf("%s (%d MiB written, %d MiB in memory): %d moves: pause p50 %v max %v; total p50 %v max %v; %s before, %s during the pause per move",
				size, mib, mib, n, p50.Round(time.Millisecond), pmax.Round(time.Millisecond), t50.Round(time.Millisecond), tmax.Round(time.Millisecond),
				mibs(pre/n), mibs(during/n))
		})
	}
}

// debian's counter: a Python server answering each connection with the
// next value of a counter it holds in memory (as branch's tests).
const (
	debianCounterStart = `python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7070)); s.listen(8); n = 0
while True:
    c, _ = s.accept(); n += 1; c.sendall(str(n).encode()); c.close()
' >/dev/null 2>&1 &
for i in $(seq 50); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 7070)).close()' 2>/dev/null && break; sleep 0.1; done`
	debianCounterRead = `python3 -c 'import socket; print(socket.create_connection(("127.0.0.1", 7070)).recv(16).decode())'`
)

func mibs(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB" }

// BenchmarkBranchAcrossNodes: branch(16) of a busybox env (a file, a
// background counter) on node a, directly on a (all sixteen children
// there) and through the router over three nodes on 127.0.0.2-4 (the
// children spread by load, the state shipped once to each other node),
// in alternating rounds so that both see the same machine. Each round
// first runs a turn on the parent, so every branch is of a new state and
// the router's ships it (incrementally: the turn's files and its whole
// process image). Reported: the p50 of a branch's round trip and of it
// per child, per path.
func BenchmarkBranchAcrossNodes(b *testing.B) {
	const n = 16
	etcd := etcdtest.Start(b)
	cli := etcdClient(b, etcd)
	// Room for the parent and sixteen children on one node.
	a := startNodeMax(b, etcd, "a", "127.0.0.2", 2*n+2)
	startNodeMax(b, etcd, "b", "127.0.0.3", 2*n+2)
	startNodeMax(b, etcd, "c", "127.0.0.4", 2*n+2)
	_, addr := startRouter(b, etcd)
	ctx := context.Background()
	direct := dial(b, a.addr)
	routed := dial(b, addr)
	r, err := direct.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		b.Fatal(err)
	}
	env := r.EnvID
	sh(b, direct, env, "mkdir -p /work && echo data > /work/file")
	sh(b, direct, env, counterStart)
	base, err := strconv.Atoi(out(sh(b, direct, env, counterRead)))
	if err != nil {
		b.Fatal(err)
	}
	// branch runs one branch(16) of the parent's next state through c and
	// returns its round trip; it checks that the children are where they
	// should be and that one on each node continues the parent's counter.
	branch := func(c *arbor.Client, spread bool, took *[]time.Duration, server *[]float64) map[string]int {
		b.Helper()
		sh(b, direct, env, "date >> /work/log")
		start := time.Now()
		br, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: n})
		if err != nil {
			b.Fatal(err)
		}
		*took = append(*took, time.Since(start))
		*server = append(*server, br.TookS)
		if len(br.EnvIDs) != n || len(br.Errors) != 0 {
			b.Fatalf("branch(%d): children %v errors %v", n, br.EnvIDs, br.Errors)
		}
		on := map[string]int{}
		for _, kid := range br.EnvIDs {
			node := placement(b, cli, kid)
			if on[node]++; on[node] == 1 {
				if got := out(sh(b, routed, kid, counterRead)); got != strconv.Itoa(base+1) {
					b.Fatalf("child %s on node %s: counter %s, want %d", kid, node, got, base+1)
				}
			}
		}
		if spread && len(on) != 3 || !spread && on[a.id] != n {
			b.Fatalf("branch(%d) children on %v", n, on)
		}
		for _, kid := range br.EnvIDs {
			if err := routed.CloseEnv(ctx, kid); err != nil {
				b.Fatal(err)
			}
		}
		return on
	}
	var ds, rs []time.Duration
	var dsrv, rsrv []float64
	var on map[string]int
	for range max(b.N, 5) {
		branch(direct, false, &ds, &dsrv)
		on = branch(routed, true, &rs, &rsrv)
	}
	d50, dmax := quantiles(ds)
	r50, rmax := quantiles(rs)
	sort.Float64s(dsrv)
	sort.Float64s(rsrv)
	b.ReportMetric(float64(d50.Milliseconds()), "direct-p50-ms")
	b.ReportMetric(float64(r50.Milliseconds()), "router-p50-ms")
	b.ReportMetric(float64(d50.Milliseconds())/n, "direct-ms/child")
	b.ReportMetric(float64(r50.Milliseconds())/n, "router-ms/child")
	b.Logf("branch(%d), %d each: on one node p50 %v (max %v, took_s p50 %.3f), %.1f ms per child; over three nodes through the router p50 %v (max %v, took_s p50 %.3f), %.1f ms per child; children %v",
		n, len(ds), d50.Round(time.Millisecond), dmax.Round(time.Millisecond), dsrv[len(dsrv)/2], float64(d50.Milliseconds())/n,
		r50.Round(time.Millisecond), rmax.Round(time.Millisecond), rsrv[len(rsrv)/2], float64(r50.Milliseconds())/n, on)
}
