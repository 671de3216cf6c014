package branch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/sandbox"
)

// BenchmarkUserNS compares the normal mode with user namespace mode, one
// rig per mode: start (launch of a fresh env), checkpoint by kind, restore
// (branch n=1) and branch(4). The first launch in user namespace mode also
// shifts the image once; it is reported as first-launch-ms. Run it with a
// fixed count, e.g.
//
//	go test -run '^$' -bench UserNS -benchtime 10x ./branch/
func BenchmarkUserNS(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("userns=%v", on), func(b *testing.B) {
			dir := b.TempDir()
			r := newRig(b, newBtrfs(b, dir), dir, 0)
			if on {
				r.opts.Launcher.UserNS = sandbox.UserNSConfig{Enabled: true}.WithDefaults()
			}
			ctx := context.Background()
			t := time.Now()
			env, img := benchEnv(b, r) // the first launch (shifts the image)
			first := time.Since(t)
			b.Logf("image %s, first launch with set-up %v", img, first)
			b.Run("start", func(b *testing.B) {
				var lat latencies
				for i := 0; i < b.N; i++ {
					t := time.Now()
					e, _, err := r.e.NewEnv(ctx, img)
					if err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t))
					b.StopTimer()
					r.e.CloseEnv(ctx, e)
					b.StartTimer()
				}
				lat.report(b, "")
				b.ReportMetric(float64(first.Microseconds())/1000, "first-launch-ms")
			})
			for _, kind := range []branch.Kind{branch.Proc, branch.Full} {
				b.Run("checkpoint-"+string(kind), func(b *testing.B) {
					var lat latencies
					for i := 0; i < b.N; i++ {
						run(b, r.e, env, fmt.Sprintf("echo %d > /work/turn", i))
						t := time.Now()
						if _, err := r.e.Checkpoint(ctx, env, kind); err != nil {
							b.Fatal(err)
						}
						lat = append(lat, time.Since(t))
					}
					lat.report(b, "")
				})
			}
			sid, err := r.e.Checkpoint(ctx, env, branch.Full)
			if err != nil {
				b.Fatal(err)
			}
			for _, n := range []int{1, 4} {
				name := "restore"
				if n > 1 {
					name = fmt.Sprintf("branch-%d", n)
				}
				b.Run(name, func(b *testing.B) {
					var lat latencies
					for i := 0; i < b.N; i++ {
						t := time.Now()
						res, err := r.e.Branch(ctx, branch.Source{State: sid}, n)
						if err != nil {
							b.Fatal(err)
						}
						lat = append(lat, time.Since(t))
						b.StopTimer()
						for j, c := range res.Children {
							if res.Errors[j] != nil {
								b.Fatalf("child %d: %v", j, res.Errors[j])
							}
							r.e.CloseEnv(ctx, c)
						}
						b.StartTimer()
					}
					lat.report(b, "")
				})
			}
		})
	}
}
