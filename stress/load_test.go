package stress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server/protocol"
)

// TestLoad runs N agent loops at once against a real arbor serve, one
// load level after another, and reports what a user with that many envs
// in flight gets: steps/s, step and evaluate latency p50/p99, busy answers,
// errors, and the server's peak RSS and CPU. Each agent has a connection
// of its own (clients/go with its default busy back-off) and runs
// episodes of the hello task until the level's time is up: reset, 3 to 7
// turns each after a think time, mixing read-only commands (none), file
// writes (fs), exports and background processes (proc); now and then a
// branch(2) whose children take a turn each and are discarded; at the
// end the solution or not (half of the episodes) and an evaluate whose
// reward must match, then close.
//
// It checks correctness only: every request answered, no error but busy
// (too_many_requests), every reward right, every env closed and nothing
// leaked afterwards. Timings go in the report (make load writes
// benchmarks/results/load.md), never into pass or fail.
//
// Knobs: ARBOR_LOAD_ENVS (the levels, e.g. "64 128 256"; default "16"),
// ARBOR_LOAD_DURATION (each level's time; default 20s), ARBOR_LOAD_THINK
// (think time range, default "500ms-2s"), ARBOR_LOAD_SEED,
// ARBOR_LOAD_FLAGS (more arbor serve flags, e.g. "--workers 4"),
// ARBOR_LOAD_REPORT (write the markdown report to this file).
func TestLoad(t *testing.T) {
	requireHost(t)
	levels := loadLevels(t, envStr("ARBOR_LOAD_ENVS", "16"))
	dur := envDuration(t, "ARBOR_LOAD_DURATION", 20*time.Second)
	thinkMin, thinkMax := thinkRange(t, envStr("ARBOR_LOAD_THINK", "500ms-2s"))
	seed := envInt(t, "ARBOR_LOAD_SEED", time.Now().UnixNano())
	top := levels[len(levels)-1]
	t.Logf("seed %d (rerun with ARBOR_LOAD_SEED=%d): levels %v, %s each, think %s-%s", seed, seed, levels, dur, thinkMin, thinkMax)

	// Every agent holds its env and, during a branch, two children: the
	// default --max-envs (256) would refuse a branch at 128 agents.
	flags := append([]string{"--max-envs", strconv.Itoa(3*top + 8)}, strings.Fields(os.Getenv("ARBOR_LOAD_FLAGS"))...)
	s := startServer(t, flags...)
	g := newCgroups(s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(len(levels))*(dur+10*time.Minute))
	defer cancel()
	ctl, err := arbor.Dial(ctx, s.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	warmUp(t, ctx, ctl)
	base := settle(t, s, g, nil)

	var results []*loadResult
	for _, n := range levels {
		lr := runLoad(t, ctx, s, loadConfig{envs: n, duration: dur, thinkMin: thinkMin, thinkMax: thinkMax, seed: seed + int64(n)})
		results = append(results, lr)
		t.Logf("level %d: %s", n, lr.summary())
		if left, err := ctl.Envs(ctx); err != nil || len(left) != 0 {
			t.Errorf("level %d: envs open after every agent closed its own: %d %v, want none", n, len(left), err)
			for _, e := range left {
				ctl.CloseEnv(ctx, e.EnvID)
			}
		}
	}
	after := settle(t, s, g, &base)
	leaks := compare(base, after, g, true)

	var rep bytes.Buffer
	writeLoadReport(&rep, results, dur, thinkMin, thinkMax, seed, flags, s)
	fmt.Fprintf(&rep, "\nLeaks after the last level (every env closed): ")
	if len(leaks) == 0 {
		fmt.Fprintf(&rep, "none.\n")
	}
	for _, l := range leaks {
		fmt.Fprintf(&rep, "\n- %s", l)
	}
	writeReport(t, os.Getenv("ARBOR_LOAD_REPORT"), rep.Bytes())
	for _, l := range leaks {
		t.Errorf("leak: %s", l)
	}
	for _, lr := range results {
		if lr.nerr > 0 {
			t.Errorf("level %d: %d errors other than busy; first: %s", lr.envs, lr.nerr, lr.errs[0])
		}
		if lr.steps == 0 {
			t.Errorf("level %d: no step answered", lr.envs)
		}
		// Every busy answer the server sent was sent again by the client
		// (after the hint), unless the client gave up and returned it.
		for _, m := range []string{protocol.MethodReset, protocol.MethodStep, protocol.MethodBranch, protocol.MethodEvaluate} {
			if got, want := lr.served[m], lr.calls[m]+lr.busy[m]-lr.busyReturned[m]; got != want {
				t.Errorf("level %d: %s: the server answered %d, want %d (%d calls + %d busy answers resent - %d returned busy)",
					lr.envs, m, got, want, lr.calls[m], lr.busy[m], lr.busyReturned[m])
			}
		}
	}
}

func envStr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// loadLevels reads "64 128 256" (spaces or commas), ascending.
func loadLevels(t *testing.T, v string) []int {
	var l []int
	for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == ',' }) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			t.Fatalf("ARBOR_LOAD_ENVS=%q: %q is not a count of envs", v, f)
		}
		l = append(l, n)
	}
	if len(l) == 0 {
		t.Fatalf("ARBOR_LOAD_ENVS=%q: no level", v)
	}
	sort.Ints(l)
	return l
}

// thinkRange reads "MIN-MAX" durations.
func thinkRange(t *testing.T, v string) (lo, hi time.Duration) {
	a, b, ok := strings.Cut(v, "-")
	var err1, err2 error
	lo, err1 = time.ParseDuration(a)
	hi, err2 = time.ParseDuration(b)
	if !ok || err1 != nil || err2 != nil || hi < lo {
		t.Fatalf("ARBOR_LOAD_THINK=%q: want MIN-MAX, e.g. 500ms-2s", v)
	}
	return lo, hi
}

type loadConfig struct {
	envs               int
	duration           time.Duration
	thinkMin, thinkMax time.Duration
	seed               int64
}

// loadResult is one level's figures.
type loadResult struct {
	envs    int
	elapsed time.Duration // from the first reset sent to the last env closed

	mu           sync.Mutex
	lat          map[string][]time.Duration // answered OK, by method (steps by turn class too)
	classes      map[string]int             // steps by checkpoint kind
	calls        map[string]int             // requests the agents made, by method
	busyReturned map[string]int             // of those, answered busy after the client's retries
	errs         []string
	nerr         int
	steps        int
	episodes     int
	rewards      [2]int // evaluations with reward 0, 1

	// From the server's /metrics, over the level.
	served map[string]int // answers, by method
	busy   map[string]int // busy (too_many_requests) answers, by method
	// From /proc/PID of the server, over the level.
	rssPeak  int64
	fdsPeak  int           // open files of the server
	envsPeak int           // arbor_active_envs
	cpu      time.Duration // utime+stime
	cpuChild time.Duration // cutime+cstime: children it reaped (CRIU, helpers)
	hostIdle float64       // share of the host's CPU time idle
	// metrics are the changes of the server's arbor_ series over the
	// level (counters, histograms' sums and counts).
	metrics map[string]float64
}

func (lr *loadResult) ok(method string, d time.Duration) {
	lr.mu.Lock()
	lr.lat[method] = append(lr.lat[method], d)
	lr.mu.Unlock()
}

func (lr *loadResult) call(method string) {
	lr.mu.Lock()
	lr.calls[method]++
	lr.mu.Unlock()
}

func (lr *loadResult) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	lr.mu.Lock()
	lr.nerr++
	if len(lr.errs) < 50 {
		lr.errs = append(lr.errs, msg)
	}
	lr.mu.Unlock()
}

func (lr *loadResult) summary() string {
	return fmt.Sprintf("%d steps in %s (%.1f/s), %d episodes, %d busy answers, %d errors, RSS peak %d MiB, CPU %.2f cores, "+
		"at most %d envs open and %d files open by the server",
		lr.steps, lr.elapsed.Round(time.Second), float64(lr.steps)/lr.elapsed.Seconds(), lr.episodes, sumCounts(lr.busy), lr.nerr,
		lr.rssPeak>>20, lr.cpu.Seconds()/lr.elapsed.Seconds(), lr.envsPeak, lr.fdsPeak)
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// runLoad runs one level: cfg.envs agents until cfg.duration has passed
// and each has closed its env.
func runLoad(t *testing.T, ctx context.Context, s *server, cfg loadConfig) *loadResult {
	lr := &loadResult{envs: cfg.envs, lat: map[string][]time.Duration{}, classes: map[string]int{},
		calls: map[string]int{}, busyReturned: map[string]int{}}
	raw0, err := s.Metrics()
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	m0 := requestCounts(raw0)
	cpu0, child0, err := procCPU(s.pid)
	if err != nil {
		t.Fatal(err)
	}
	busy0, total0 := hostCPU()
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan peaks)
	go func() { sampled <- samplePeaks(sampling, s) }()

	began := time.Now()
	end := began.Add(cfg.duration)
	var wg sync.WaitGroup
	for i := 0; i < cfg.envs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &agent{lr: lr, rng: rand.New(rand.NewSource(cfg.seed*1000 + int64(i))), cfg: cfg, end: end, id: i}
			a.run(ctx, s.addr)
		}()
	}
	wg.Wait()
	lr.elapsed = time.Since(began)
	stopSampling()
	pk := <-sampled
	lr.rssPeak, lr.fdsPeak, lr.envsPeak = pk.rss, pk.fds, pk.envs
	cpu1, child1, err := procCPU(s.pid)
	if err != nil {
		t.Fatal(err)
	}
	lr.cpu, lr.cpuChild = cpu1-cpu0, child1-child0
	busy1, total1 := hostCPU()
	if total1 > total0 {
		lr.hostIdle = 1 - float64(busy1-busy0)/float64(total1-total0)
	}
	raw1, err := s.Metrics()
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	m1 := requestCounts(raw1)
	lr.metrics = map[string]float64{}
	for k, v := range raw1 {
		if strings.HasPrefix(k, "arbor_") {
			lr.metrics[k] = v - raw0[k]
		}
	}
	lr.served, lr.busy = map[string]int{}, map[string]int{}
	for k, v := range m1 {
		n := v - m0[k]
		lr.served[k.method] += n
		if k.code == protocol.CodeTooManyReqs {
			lr.busy[k.method] += n
		}
	}
	lr.steps = len(lr.lat[protocol.MethodStep])
	return lr
}

// agent is one simulated RL agent with a connection of its own.
type agent struct {
	lr  *loadResult
	rng *rand.Rand
	cfg loadConfig
	end time.Time
	id  int
	c   *arbor.Client
}

// loadReqTimeout bounds one request: past it the request counts as
// unanswered, a failure.
const loadReqTimeout = 5 * time.Minute

func (a *agent) run(ctx context.Context, addr string) {
	c, err := arbor.Dial(ctx, addr, nil)
	if err != nil {
		a.lr.fail("agent %d: dial: %v", a.id, err)
		return
	}
	defer c.Close()
	a.c = c
	// Agents start spread over one think time, as a fleet of them does.
	a.sleep(time.Duration(a.rng.Int63n(int64(a.cfg.thinkMax) + 1)))
	for time.Now().Before(a.end) {
		if !a.episode(ctx) {
			return
		}
	}
}

func (a *agent) sleep(d time.Duration) { time.Sleep(d) }

func (a *agent) think() {
	d := a.cfg.thinkMin
	if span := a.cfg.thinkMax - a.cfg.thinkMin; span > 0 {
		d += time.Duration(a.rng.Int63n(int64(span)))
	}
	a.sleep(d)
}

// do runs one request, timing it and sorting its outcome: busy answers
// (the client's retries exhausted) are sent again after their hint and
// are no error; any other error is. It reports whether the request
// succeeded.
func (a *agent) do(ctx context.Context, method, what string, fn func(ctx context.Context) error) bool {
	for {
		a.lr.call(method)
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, loadReqTimeout)
		err := fn(rctx)
		cancel()
		var pe *protocol.Error
		switch {
		case err == nil:
			a.lr.ok(method, time.Since(start))
			return true
		case errors.As(err, &pe) && pe.Code == protocol.CodeTooManyReqs:
			a.lr.mu.Lock()
			a.lr.busyReturned[method]++
			a.lr.mu.Unlock()
			a.sleep(max(pe.RetryAfter(), 100*time.Millisecond))
		case errors.Is(err, context.DeadlineExceeded):
			a.lr.fail("agent %d: %s: no answer within %s", a.id, what, loadReqTimeout)
			return false
		default:
			a.lr.fail("agent %d: %s: %v", a.id, what, err)
			return false
		}
	}
}

// turn is one step of an agent: the command and the class it means.
func (a *agent) turnCmd(n int) (cmd, kind string) {
	switch r := a.rng.Intn(10); {
	case r < 4: // reading: the commonest turn of an agent
		return "cat /work/hello/README; ls -la /work/hello", "read"
	case r < 7:
		return fmt.Sprintf("echo 'line %d' >> /work/hello/notes.txt && wc -l /work/hello/notes.txt", n), "write"
	case r < 9:
		return fmt.Sprintf("export STEP=%d; echo $STEP", n), "export"
	default:
		return "sleep 600 >/dev/null 2>&1 & echo started", "background"
	}
}

// episode runs one episode; false when the agent should stop (an error).
func (a *agent) episode(ctx context.Context) bool {
	var r *arbor.ResetResult
	if !a.do(ctx, protocol.MethodReset, "reset", func(ctx context.Context) (err error) {
		r, err = a.c.Reset(ctx, arbor.ResetParams{Task: "hello"})
		return err
	}) {
		return false
	}
	env := r.EnvID
	defer a.do(ctx, protocol.MethodClose, "close "+env, func(ctx context.Context) error { return a.c.CloseEnv(ctx, env) })
	turns := 3 + a.rng.Intn(5)
	for n := 0; n < turns && time.Now().Before(a.end); n++ {
		a.think()
		cmd, kind := a.turnCmd(n)
		if !a.step(ctx, env, cmd, kind) {
			return false
		}
		if a.rng.Intn(8) == 0 && !a.branch(ctx, env) {
			return false
		}
	}
	if !time.Now().Before(a.end) {
		return true // time is up: close without evaluating
	}
	solve := a.rng.Intn(2) == 0
	if solve {
		a.think()
		if !a.step(ctx, env, `echo "$GREETING" > /work/hello/greeting.txt`, "write") {
			return false
		}
	}
	var ev *arbor.Evaluation
	if !a.do(ctx, protocol.MethodEvaluate, "evaluate "+env, func(ctx context.Context) (err error) {
		ev, err = a.c.Evaluate(ctx, env)
		return err
	}) {
		return false
	}
	want := 0.0
	if solve {
		want = 1
	}
	a.lr.mu.Lock()
	a.lr.episodes++
	a.lr.rewards[int(ev.Reward)]++
	a.lr.mu.Unlock()
	if ev.Reward != want {
		a.lr.fail("agent %d: evaluate %s: reward %v, want %v (solved %v)", a.id, env, ev.Reward, want, solve)
		return false
	}
	return true
}

func (a *agent) step(ctx context.Context, env, cmd, kind string) bool {
	var res *arbor.StepResult
	ok := a.do(ctx, protocol.MethodStep, "step "+env+" "+kind, func(ctx context.Context) (err error) {
		res, err = a.c.Step(ctx, env, arbor.Bash(cmd, 0))
		return err
	})
	if !ok {
		return false
	}
	if res.Obs.ExitCode != 0 {
		a.lr.fail("agent %d: step %s %q: exit %d: %s", a.id, env, cmd, res.Obs.ExitCode, res.Obs.Stderr)
		return false
	}
	a.lr.mu.Lock()
	a.lr.classes[kind+" -> "+res.Info.Checkpoint]++
	a.lr.mu.Unlock()
	return true
}

// branch makes two children of env, takes a turn in each and discards
// them.
func (a *agent) branch(ctx context.Context, env string) bool {
	var br *arbor.BranchResult
	if !a.do(ctx, protocol.MethodBranch, "branch "+env, func(ctx context.Context) (err error) {
		br, err = a.c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 2})
		return err
	}) {
		return false
	}
	good := true
	for i, id := range br.EnvIDs {
		if id == "" {
			a.lr.fail("agent %d: branch %s: child %d: %v", a.id, env, i, br.Errors)
			good = false
			continue
		}
		if good {
			a.think()
			cmd, kind := a.turnCmd(100 + i)
			good = a.step(ctx, id, cmd, kind)
		}
		if !a.do(ctx, protocol.MethodDiscard, "discard "+id, func(ctx context.Context) error { return a.c.Discard(ctx, id) }) {
			good = false
		}
	}
	return good
}

// metricKey is one series of arbor_requests_total.
type metricKey struct{ method, code string }

// requestCounts picks arbor_requests_total by method and code out of
// the server's metrics.
func requestCounts(m map[string]float64) map[metricKey]int {
	out := map[metricKey]int{}
	for k, v := range m {
		rest, ok := strings.CutPrefix(k, "arbor_requests_total{")
		if !ok {
			continue
		}
		var key metricKey
		for _, l := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
			name, val, _ := strings.Cut(l, "=")
			val = strings.Trim(val, `"`)
			switch name {
			case "method":
				key.method = val
			case "code":
				key.code = val
			}
		}
		out[key] += int(v)
	}
	return out
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times.
var clockTick = func() time.Duration {
	if out, err := exec.Command("getconf", "CLK_TCK").Output(); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			return time.Second / time.Duration(n)
		}
	}
	return 10 * time.Millisecond
}()

// procCPU is pid's utime+stime and its reaped children's cutime+cstime.
func procCPU(pid int) (own, children time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	f := statFields(b) // f[0] is state (field 3): utime is field 14
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var v [4]int64
	for i := range v {
		v[i], _ = strconv.ParseInt(f[11+i], 10, 64)
	}
	return time.Duration(v[0]+v[1]) * clockTick, time.Duration(v[2]+v[3]) * clockTick, nil
}

// hostCPU is the host's busy and total jiffies (/proc/stat).
func hostCPU() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseInt(f, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// peaks are the most a level's sampling saw of the server.
type peaks struct {
	rss       int64
	fds, envs int
}

// samplePeaks reads the server's VmRSS and open files every 250 ms,
// and its open envs (arbor_active_envs) every second, until ctx ends.
func samplePeaks(ctx context.Context, s *server) peaks {
	var pk peaks
	tk := time.NewTicker(250 * time.Millisecond)
	defer tk.Stop()
	for i := 0; ; i++ {
		pk.rss = max(pk.rss, rssOf(s.pid))
		if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.pid)); err == nil {
			pk.fds = max(pk.fds, len(fds))
		}
		if i%4 == 0 {
			if m, err := s.Metrics(); err == nil {
				pk.envs = max(pk.envs, int(m["arbor_active_envs"]))
			}
		}
		select {
		case <-ctx.Done():
			return pk
		case <-tk.C:
		}
	}
}

func pct(d []time.Duration, p float64) string {
	if len(d) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f ms", float64(percentile(d, p).Microseconds())/1000)
}

// writeLoadReport writes the levels' figures as markdown.
func writeLoadReport(w *bytes.Buffer, results []*loadResult, dur, thinkMin, thinkMax time.Duration, seed int64, flags []string, s *server) {
	rev, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	host, _ := os.Hostname()
	fmt.Fprintf(w, "# Load test\n\n%s, commit %s, host %s (%d CPUs, %s). `make load`: stress.TestLoad, seed %d; "+
		"arbor serve --warm 1 %s.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), strings.TrimSpace(string(rev)), host, runtime.NumCPU(), memTotal(), seed, strings.Join(flags, " "))
	fmt.Fprintf(w, "Each level runs N agents for %s, each on a connection of its own (clients/go, default busy back-off): "+
		"episodes of the hello task (busybox), 3-7 turns after a think time of %s-%s (read-only, file write, export, background process), "+
		"a branch(2) after 1 turn in 8 with a turn in each child and both discarded, the solution in half the episodes, evaluate, close.\n\n",
		dur, thinkMin, thinkMax)
	fmt.Fprintf(w, "The server's limit of open files: %s.\n\n", openFilesLimit(s.pid))
	fmt.Fprintf(w, "| envs | steps/s | step p50 | step p99 | evaluate p50 | evaluate p99 | reset p50 | reset p99 | branch p50 | branch p99 | busy answers | errors | RSS peak | CPU (cores) | host idle |\n")
	fmt.Fprintf(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, lr := range results {
		for _, d := range lr.lat {
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		}
		fmt.Fprintf(w, "| %d | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %d | %d | %d MiB | %.2f (+%.2f children) | %.0f%% |\n",
			lr.envs, float64(lr.steps)/lr.elapsed.Seconds(),
			pct(lr.lat[protocol.MethodStep], 50), pct(lr.lat[protocol.MethodStep], 99),
			pct(lr.lat[protocol.MethodEvaluate], 50), pct(lr.lat[protocol.MethodEvaluate], 99),
			pct(lr.lat[protocol.MethodReset], 50), pct(lr.lat[protocol.MethodReset], 99),
			pct(lr.lat[protocol.MethodBranch], 50), pct(lr.lat[protocol.MethodBranch], 99),
			sumCounts(lr.busy), lr.nerr, lr.rssPeak>>20,
			lr.cpu.Seconds()/lr.elapsed.Seconds(), lr.cpuChild.Seconds()/lr.elapsed.Seconds(), 100*lr.hostIdle)
	}
	fmt.Fprintf(w, "\nLatency is from the request sent to its answer, busy back-off included. CPU is the serve process's utime+stime "+
		"(/proc/PID/stat) per second of the level; children is cutime+cstime of the processes it reaped (CRIU, helpers), "+
		"not the sandboxes' own work.\n")
	for _, lr := range results {
		fmt.Fprintf(w, "\n## %d envs\n\n%s.\n\n", lr.envs, lr.summary())
		fmt.Fprintf(w, "| method | agent calls | server answers | busy answers | returned busy to the agent | ok | p50 | p99 |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, m := range []string{protocol.MethodReset, protocol.MethodStep, protocol.MethodBranch, protocol.MethodDiscard, protocol.MethodEvaluate, protocol.MethodClose} {
			fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %s | %s |\n", m, lr.calls[m], lr.served[m], lr.busy[m], lr.busyReturned[m],
				len(lr.lat[m]), pct(lr.lat[m], 50), pct(lr.lat[m], 99))
		}
		var kinds []string
		for k, n := range lr.classes {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
		sort.Strings(kinds)
		fmt.Fprintf(w, "\nTurns by command and the checkpoint the server took: %s. Episodes evaluated: %d (reward 1: %d, 0: %d).\n",
			strings.Join(kinds, ", "), lr.episodes, lr.rewards[1], lr.rewards[0])
		writeServerView(w, lr.metrics)
		if lr.nerr > 0 {
			fmt.Fprintf(w, "\nErrors (%d):\n\n", lr.nerr)
			for _, e := range lr.errs {
				fmt.Fprintf(w, "- %s\n", e)
			}
		}
	}
	warns, errs := s.log.counts()
	fmt.Fprintf(w, "\nServer log: %d WARN and %d ERROR lines.\n", len(warns), len(errs))
	for _, l := range append(errs, warns...)[:min(10, len(errs)+len(warns))] {
		fmt.Fprintf(w, "    %s\n", l)
	}
}

// writeServerView writes where the server's time went over a level,
// from its /metrics: admission per class (docs/architecture.md,
// Admission control), the step's own time and the checkpoints.
func writeServerView(w *bytes.Buffer, m map[string]float64) {
	// mean of a histogram: name, then its labels ("" or {k="v"}).
	mean := func(name string, labels ...string) string {
		l := strings.Join(labels, "")
		if n := m[name+"_count"+l]; n > 0 {
			return fmt.Sprintf("%.0f ms", 1000*m[name+"_sum"+l]/n)
		}
		return "-"
	}
	fmt.Fprintf(w, "\nThe server's view (/metrics, over the level):\n\n| class | admitted | mean admission wait | refused busy |\n| --- | ---: | ---: | ---: |\n")
	for _, c := range []string{"reset", "step", "branch", "evaluate"} {
		l := fmt.Sprintf(`{class="%s"}`, c)
		fmt.Fprintf(w, "| %s | %.0f | %s | %.0f |\n", c, m["arbor_admit_wait_seconds_count"+l], mean("arbor_admit_wait_seconds", l), m["arbor_admit_busy_total"+l])
	}
	var kinds []string
	for _, k := range []string{"none", "fs", "proc", "full"} {
		kinds = append(kinds, fmt.Sprintf("%s %.0f", k, m[fmt.Sprintf(`arbor_checkpoints_total{kind="%s"}`, k)]))
	}
	fmt.Fprintf(w, "\nServed once admitted, on average: step (bash) %s, branch(2) %s, reset %s, evaluate %s. States by checkpoint kind (arbor_checkpoints_total; a reset counts its restored state as full): %s; "+
		"background checkpoints %.0f, %s each on average; checkpoint run time %.0f s, of it %.0f s waited through by requests "+
		"(arbor_checkpoint_exposed_seconds_total; time queued behind other checkpoints not counted).\n",
		mean("arbor_step_seconds", `{tool="bash"}`), mean("arbor_branch_seconds"), mean("arbor_reset_seconds"), mean("arbor_evaluate_seconds"),
		strings.Join(kinds, ", "),
		m[`arbor_checkpoint_seconds_count{mode="background"}`], mean("arbor_checkpoint_seconds", `{mode="background"}`),
		m["arbor_checkpoint_time_seconds_total"], m["arbor_checkpoint_exposed_seconds_total"])
}

// openFilesLimit is pid's soft RLIMIT_NOFILE as /proc/PID/limits gives it.
func openFilesLimit(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Max open files"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				return f[0]
			}
		}
	}
	return "unknown"
}

func memTotal() string {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return fmt.Sprintf("%.1f GiB RAM", float64(kb)/(1<<20))
		}
	}
	return "RAM unknown"
}

// TestRequestCounts: arbor_requests_total's series, as servetest.Metrics
// keys them, add up by method and code; other series are left out.
func TestRequestCounts(t *testing.T) {
	got := requestCounts(map[string]float64{
		`arbor_requests_total{code="ok",method="step"}`:                 7,
		`arbor_requests_total{code="too_many_requests",method="reset"}`: 2,
		`arbor_requests_total{code="ok",method="reset"}`:                3,
		`arbor_admit_busy_total{class="reset"}`:                         2,
		"arbor_active_envs":                                             4,
	})
	want := map[metricKey]int{{"step", "ok"}: 7, {"reset", protocol.CodeTooManyReqs}: 2, {"reset", "ok"}: 3}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%v: %d, want %d", k, got[k], n)
		}
	}
}
