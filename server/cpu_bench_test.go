package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
)

// procCPU is a process's CPU accounting from /proc/PID/stat: its own user
// and system time (all threads) and that of its children it has waited
// for (the server's CRIU runs), in clock ticks.
type procCPU struct{ self, children int64 }

// clockTick is USER_HZ, 100 on every Linux this runs on.
const clockTick = 10 * time.Millisecond

func readProcCPU(tb testing.TB, pid int) procCPU {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name, which ends at the last ')': state is
	// field 3, utime 14, stime 15, cutime 16, cstime 17.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	n := func(i int) int64 {
		v, err := strconv.ParseInt(f[i-3], 10, 64)
		if err != nil {
			tb.Fatal(err)
		}
		return v
	}
	return procCPU{self: n(14) + n(15), children: n(16) + n(17)}
}

// procStatus sums the voluntary and involuntary context switches of all
// of a process's threads (a wakeup each, at most) and reads its RSS.
func procStatus(tb testing.TB, pid int) (switches int64, rssKiB int64) {
	tb.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	field := func(raw, name string) int64 {
		_, rest, ok := strings.Cut(raw, "\n"+name+":")
		if !ok {
			return 0
		}
		v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
		return v
	}
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that exited
		}
		switches += field(string(raw), "voluntary_ctxt_switches") + field(string(raw), "nonvoluntary_ctxt_switches")
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	return switches, field(string(raw), "VmRSS")
}

// cpuServer is a real `arbor serve` child process (so its accounting
// excludes this test's client) and a client connected to it.
func cpuServer(b *testing.B) (*servetest.Server, *arbor.Client) {
	servetest.RequireHost(b)
	s := servetest.Start(b, servetest.Options{Global: []string{"--log-level", "warn"}})
	c := s.Dial(b, context.Background(), 3*time.Minute)
	b.Cleanup(func() { c.Close() })
	return s, c
}

// turnCPUCases are commands that make each class of turn on busybox
// (docs/inspector.md, "Net change"); %d is the turn's number.
var turnCPUCases = []struct{ class, cmd string }{
	{"none", "cat /etc/passwd >/dev/null"},
	{"fs", "echo %d >> /work/f"},
	{"proc", "export V%d=1"},
	{"full", "echo %d >> /work/f; export W%d=1"},
}

// BenchmarkTurnCPU is the server's CPU time per turn by class, from the
// `arbor serve` process's own accounting (/proc/PID/stat utime+stime, at
// clock-tick resolution: run a few hundred turns, -benchtime=300x), with
// the CPU of its waited-for children (CRIU dumps) apart, against the
// floor: the CPU of a bare persistent bash on a pipe (and its children)
// running the same commands as many times. Each turn's class is checked.
func BenchmarkTurnCPU(b *testing.B) {
	s, c := cpuServer(b)
	ctx := context.Background()
	r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseEnv(ctx, r.EnvID)
	sh(b, c, r.EnvID, "mkdir -p /work && echo 0 > /work/f")
	sh(b, c, r.EnvID, "true") // past the first turn's checkpoint
	for _, tc := range turnCPUCases {
		b.Run(tc.class, func(b *testing.B) {
			cmds := make([]string, b.N)
			for i := range cmds {
				cmds[i] = strings.ReplaceAll(tc.cmd, "%d", strconv.Itoa(i)+"x"+strconv.Itoa(b.N))
			}
			before := readProcCPU(b, s.Pid())
			start := time.Now()
			b.ResetTimer()
			for i := range b.N {
				res, err := c.Step(ctx, r.EnvID, arbor.Bash(cmds[i], 20*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				if res.Obs.ExitCode != 0 || res.Info.Checkpoint != tc.class {
					b.Fatalf("%q: exit %d, class %s, want %s", cmds[i], res.Obs.ExitCode, res.Info.Checkpoint, tc.class)
				}
			}
			b.StopTimer()
			wall := time.Since(start)
			after := readProcCPU(b, s.Pid())
			floor := bashFloor(b, cmds)
			per := func(ticks int64) float64 {
				return float64(time.Duration(ticks)*clockTick) / float64(time.Microsecond) / float64(b.N)
			}
			b.ReportMetric(per(after.self-before.self), "server-us/turn")
			b.ReportMetric(per(after.children-before.children), "children-us/turn")
			b.ReportMetric(per(floor), "floor-us/turn")
			b.ReportMetric(float64(wall.Microseconds())/float64(b.N), "wall-us/turn")
		})
	}
}

// bashFloor runs cmds one at a time in one persistent bash on a pipe,
// each answered by a marker line, and returns the CPU ticks bash and its
// children took.
func bashFloor(b *testing.B, cmds []string) int64 {
	b.Helper()
	dir := b.TempDir()
	cmd := exec.Command("bash", "--norc", "--noprofile")
	cmd.Dir = dir
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	rd := bufio.NewReader(out)
	run := func(c string) {
		// /work/f of the sandbox is the temporary folder's f here.
		c = strings.ReplaceAll(c, "/work/", dir+"/")
		if _, err := io.WriteString(in, c+"\necho __done__\n"); err != nil {
			b.Fatal(err)
		}
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				b.Fatal(err)
			}
			if l == "__done__\n" {
				return
			}
		}
	}
	run("true")
	before := readProcCPU(b, cmd.Process.Pid)
	for _, c := range cmds {
		run(c)
	}
	after := readProcCPU(b, cmd.Process.Pid)
	in.Close()
	cmd.Wait()
	return after.self + after.children - before.self - before.children
}

// BenchmarkIdleEnvCPU is what open, idle envs cost the server: N envs
// reset and stepped once, then left alone for 10 s; the server's CPU per
// env per second, its context switches (wakeups) per second, and its RSS
// per env, each against the same server with no env open measured first.
func BenchmarkIdleEnvCPU(b *testing.B) {
	const idle = 10 * time.Second
	for _, n := range []int{16, 64} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			s, c := cpuServer(b)
			ctx := context.Background()
			measure := func() (cpuTicks, switches int64) {
				time.Sleep(2 * time.Second) // the last step's background work
				cpu0 := readProcCPU(b, s.Pid())
				sw0, _ := procStatus(b, s.Pid())
				time.Sleep(idle)
				cpu1 := readProcCPU(b, s.Pid())
				sw1, _ := procStatus(b, s.Pid())
				return cpu1.self - cpu0.self, sw1 - sw0
			}
			baseCPU, baseSw := measure()
			_, baseRSS := procStatus(b, s.Pid())
			ids := make([]string, n)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 4)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sem <- struct{}{}
					defer func() { <-sem }()
					r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
					if err != nil {
						b.Error(err)
						return
					}
					ids[i] = r.EnvID
					sh(b, c, r.EnvID, "true")
				}()
			}
			wg.Wait()
			defer func() {
				for _, id := range ids {
					if id != "" {
						c.CloseEnv(ctx, id)
					}
				}
			}()
			b.ResetTimer()
			var cpu, sw int64
			for range b.N {
				dc, ds := measure()
				cpu, sw = cpu+dc, sw+ds
			}
			b.StopTimer()
			_, rss := procStatus(b, s.Pid())
			secs := idle.Seconds() * float64(b.N)
			b.ReportMetric(float64(time.Duration(baseCPU)*clockTick)/float64(time.Microsecond)/idle.Seconds(), "base-cpu-us/s")
			b.ReportMetric(float64(baseSw)/idle.Seconds(), "base-wakeups/s")
			b.ReportMetric(float64(time.Duration(cpu)*clockTick)/float64(time.Microsecond)/secs, "cpu-us/s")
			b.ReportMetric(float64(sw)/secs, "wakeups/s")
			b.ReportMetric((float64(time.Duration(cpu)*clockTick)/secs-float64(time.Duration(baseCPU)*clockTick)/idle.Seconds())/float64(time.Microsecond)/float64(n), "cpu-us/env/s")
			b.ReportMetric((float64(sw)/secs-float64(baseSw)/idle.Seconds())/float64(n), "wakeups/env/s")
			b.ReportMetric(float64(rss-baseRSS)/float64(n), "rss-KiB/env")
		})
	}
}
