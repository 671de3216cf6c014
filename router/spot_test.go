package router_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/internal/servetest"
)

// The spot-preemption study (issue 39, docs/cluster.md "Spot
// preemption"): BenchmarkSpot runs episodes of shipped tasks through a
// router in front of three real `arbor serve` nodes on 127.0.0.2-4 while
// the nodes holding them are preempted, and reports what survived. Its
// knobs are environment variables (make spot sets them):
//
//	SPOT_EPISODES  episodes per arm (20)
//	SPOT_PARALLEL  episodes running at once (3)
//	SPOT_STEPS     counter steps per episode (8: hello allows 10 turns)
//	SPOT_THINK     pause between steps, the agent's think time (1s)
//	SPOT_TTL       the nodes' --cluster-ttl (2s)
//	SPOT_ARMS      arms to run, of spot, drain, kill and control ("spot,control")
//	SPOT_SEED      the random seed (1)
//	SPOT_REPORT    a markdown file the table is written to (none)
//	SPOT_LOG       a file the nodes' warnings, errors and moves go to (none)
//
// Arm spot: nodes with --drain-timeout 10s and --replicas 2; each
// preemption is SIGTERM (the node drains, then exits) or SIGKILL, half
// and half; arms drain and kill are the same nodes with only SIGTERM, or
// only SIGKILL. Arm control: nodes with neither, every preemption a
// SIGKILL.
// After each preemption a fresh node (a new id and an empty state dir,
// as a spot VM that comes back) joins on the same address, so the
// cluster is back at three; the next preemption waits for that.

// spotTasks are the shipped tasks the episodes run (busybox: no image
// download), each with its solution (the task file's) and the reward it
// gets when nothing is preempted.
var spotTasks = []struct{ name, solution string }{
	{"hello", `echo "$GREETING" > /work/hello/greeting.txt`},
	{"sort-numbers", `sort -n /work/sort/numbers.txt > /work/sort/sorted.txt`},
}

// spotStep is one counter step: it prints the file counter and the shell
// variable as it found them, then increments both. In a state that is
// whole they are equal; a state rolled back shows a smaller pair, a torn
// one (files of one turn, shell of another) two different numbers.
const spotStep = `mkdir -p /work/spot; c=$(cat /work/spot/c 2>/dev/null || echo 0); echo "$c ${SPOT:-0}"; echo $((c+1)) > /work/spot/c; SPOT=$((${SPOT:-0}+1))`

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envDur(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// spotNode is one arbor serve of the study's cluster.
type spotNode struct {
	id, ip string
	srv    *servetest.Server
}

// spotCluster is etcd, three arbor serve nodes and a router; preempt
// stops one node and starts a fresh one in its place.
type spotCluster struct {
	b     *testing.B
	etcd  string
	cli   *clientv3.Client
	tasks string
	args  []string

	mu       sync.Mutex
	nodes    map[string]*spotNode // live ones, by id
	seq      int
	pauses   []time.Duration // every "migrated env ... pause=" the nodes logged
	startups []time.Duration // a fresh node's start, until it is registered
	starting sync.WaitGroup  // fresh nodes starting
	log      *os.File        // SPOT_LOG: the nodes' warnings, errors, drains and moves
}

var pauseRe = regexp.MustCompile(`msg="migrated env".* pause=(\S+)`)

// start starts a fresh node on ip: a new id, an empty state dir.
func (sc *spotCluster) start(ip string) {
	sc.b.Helper()
	sc.mu.Lock()
	sc.seq++
	id := fmt.Sprintf("n%d", sc.seq)
	sc.mu.Unlock()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		sc.b.Fatalf("listen on %s (loopback): %v", ip, err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := servetest.Start(sc.b, servetest.Options{Addr: addr,
		Args: append([]string{"--tasks", sc.tasks, "--warm", "1", "--env-idle-ttl", "-1s",
			"--cluster-etcd", sc.etcd, "--node-id", id}, sc.args...),
		OnLine: func(l string) {
			if sc.log != nil && (strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") ||
				strings.Contains(l, `msg=drained`) || strings.Contains(l, `msg="migrated env"`) || strings.Contains(l, "drain")) {
				sc.mu.Lock()
				fmt.Fprintf(sc.log, "%s %s: %s\n", time.Now().UTC().Format("15:04:05.000"), id, l)
				sc.mu.Unlock()
			}
			if m := pauseRe.FindStringSubmatch(l); m != nil {
				if d, err := time.ParseDuration(m[1]); err == nil {
					sc.mu.Lock()
					sc.pauses = append(sc.pauses, d)
					sc.mu.Unlock()
				}
			}
		}})
	srv.Dial(sc.b, context.Background(), 3*time.Minute).Close()
	// A node takes resets once its registration is in etcd.
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if g, err := sc.cli.Get(context.Background(), cluster.NodeKey(id)); err == nil && len(g.Kvs) > 0 {
			break
		}
		if time.Now().After(end) {
			sc.b.Fatalf("node %s not registered 30 s after it answered", id)
		}
	}
	sc.mu.Lock()
	sc.nodes[id] = &spotNode{id: id, ip: ip, srv: srv}
	sc.mu.Unlock()
}

// placementOf is the node etcd places env on ("" for none or an error).
func (sc *spotCluster) placementOf(env string) string {
	g, err := sc.cli.Get(context.Background(), cluster.EnvKey(env))
	if err != nil || len(g.Kvs) == 0 {
		return ""
	}
	var p cluster.Placement
	if json.Unmarshal(g.Kvs[0].Value, &p) != nil {
		return ""
	}
	return p.Node
}

// replicaOf says where env's replica is, for the log.
func (sc *spotCluster) replicaOf(env string) string {
	g, err := sc.cli.Get(context.Background(), cluster.ReplicaKey(env))
	if err != nil || len(g.Kvs) == 0 {
		return "no replica"
	}
	var rp cluster.Replica
	json.Unmarshal(g.Kvs[0].Value, &rp)
	sc.mu.Lock()
	_, live := sc.nodes[rp.Node]
	sc.mu.Unlock()
	return fmt.Sprintf("replica on %s (live %v) at %s, %v old", rp.Node, live, rp.State, time.Since(rp.At).Round(time.Millisecond))
}

// preempt stops node id (drain: SIGTERM, and waits for its exit; else
// SIGKILL) and starts a fresh node on its address in the background
// (wait waits for it); it returns how long the node took to stop.
func (sc *spotCluster) preempt(id string, drain bool) time.Duration {
	sc.mu.Lock()
	n := sc.nodes[id]
	delete(sc.nodes, id)
	sc.mu.Unlock()
	t0 := time.Now()
	if drain {
		if err := n.srv.Stop(2 * time.Minute); err != nil {
			sc.b.Logf("node %s after SIGTERM: %v", id, err)
		}
	} else {
		n.srv.Kill()
	}
	took := time.Since(t0)
	sc.starting.Add(1)
	go func() {
		defer sc.starting.Done()
		t0 := time.Now()
		sc.start(n.ip)
		sc.mu.Lock()
		sc.startups = append(sc.startups, time.Since(t0))
		sc.mu.Unlock()
	}()
	return took
}

// logf writes a line of the driver's to SPOT_LOG.
func (sc *spotCluster) logf(format string, args ...any) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.log != nil {
		fmt.Fprintf(sc.log, "%s driver: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
}

// live is how many nodes are up.
func (sc *spotCluster) live() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.nodes)
}

// spotEpisode is what one episode did.
type spotEpisode struct {
	task      int
	env       string
	wall      time.Duration
	reward    float64
	err       error // the episode could not finish: lost
	torn      string
	lost      int           // turns the env came back without (a failover to an older replica)
	told      int           // answers that said the env was recovered at an older state (info.recovered)
	retries   int           // requests answered retryable infra errors, sent again
	preempted int           // preemptions of the node holding it
	stall     time.Duration // the longest step round trip
}

// intact: finished, every step found the state it left, and the reward
// is the one the task gets without preemptions (1: both tasks solved).
func (e *spotEpisode) intact() bool {
	return e.err == nil && e.torn == "" && e.lost == 0 && e.reward == 1
}

// retry sends a request again while it fails with a retryable infra
// error (node_unavailable while a dead node's lease lasts, and a
// failover), for at most giveUp, as a trainer would before it masks the
// sample.
func retry(ctx context.Context, ep *spotEpisode, giveUp time.Duration, f func(context.Context) error) error {
	end := time.Now().Add(giveUp)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := f(cctx)
		cancel()
		var pe *arbor.Error
		if err == nil || !errors.As(err, &pe) || !pe.Retryable || time.Now().After(end) {
			return err
		}
		ep.retries++
		time.Sleep(200 * time.Millisecond)
	}
}

// runEpisode resets task, runs steps counter steps with think time
// between them and the solution halfway, evaluates and closes. envs
// gets the env id once the reset answered (the preemptor reads it).
func runEpisode(ctx context.Context, c *arbor.Client, task, steps int, think, giveUp time.Duration, env chan<- string) *spotEpisode {
	ep := &spotEpisode{task: task}
	start := time.Now()
	defer func() { ep.wall = time.Since(start) }()
	var id string
	ep.err = retry(ctx, ep, giveUp, func(ctx context.Context) error {
		r, err := c.Reset(ctx, arbor.ResetParams{Task: spotTasks[task].name})
		if err == nil {
			id = r.EnvID
		}
		return err
	})
	if ep.err != nil {
		return ep
	}
	ep.env = id
	env <- id
	defer c.CloseEnv(context.Background(), id)
	solved := false
	step := func(cmd string) (string, error) {
		var out string
		t0 := time.Now()
		err := retry(ctx, ep, giveUp, func(ctx context.Context) error {
			r, err := c.Step(ctx, id, arbor.Bash(cmd, 30*time.Second))
			if err == nil {
				out = strings.TrimSpace(string(r.Obs.Stdout))
				if r.Info.Recovered != nil {
					// The env went back: whatever the client did after
					// that state, the solution too, is to do again.
					ep.told++
					solved = false
				}
			}
			return err
		})
		ep.stall = max(ep.stall, time.Since(t0))
		return out, err
	}
	for i := 0; i < steps; {
		time.Sleep(think)
		if i == steps/2 {
			if _, ep.err = step(spotTasks[task].solution); ep.err != nil {
				return ep
			}
			solved = true
		}
		got, err := step(spotStep)
		if err != nil {
			ep.err = fmt.Errorf("step %d: %w", i, err)
			return ep
		}
		f, v, _ := strings.Cut(got, " ")
		fi, ferr := strconv.Atoi(f)
		if ferr != nil || f != v {
			ep.torn = fmt.Sprintf("step %d found file %q, shell %q", i, f, v)
			return ep
		}
		if fi > i {
			ep.torn = fmt.Sprintf("step %d found %d: a turn ran twice", i, fi)
			return ep
		}
		// fi < i: the env came back at an older state (a replica behind
		// its head). The counter goes on from there; the lost turns are
		// counted, not replayed.
		ep.lost += i - fi
		i = fi + 1
	}
	if !solved {
		if _, ep.err = step(spotTasks[task].solution); ep.err != nil {
			return ep
		}
	}
	ep.err = retry(ctx, ep, giveUp, func(ctx context.Context) error {
		ev, err := c.Evaluate(ctx, id)
		if err == nil {
			ep.reward = ev.Reward
		}
		return err
	})
	return ep
}

// spotArm is one arm's results.
type spotArm struct {
	name               string
	base, run          []*spotEpisode
	drains, kills      int
	pauses             []time.Duration
	took               time.Duration
	preemptsPerEpisode map[int]int
	drainTook          []time.Duration // SIGTERM to exit, draining
	startups           []time.Duration
}

// runPass runs n episodes, par at once; with preempt, a preemptor
// preempts the nodes holding running episodes, each episode aiming at
// 1-5 preemptions.
func runPass(b *testing.B, sc *spotCluster, c *arbor.Client, arm string, n, par, steps int, think, giveUp time.Duration, rng *rand.Rand, preempt bool, res *spotArm) []*spotEpisode {
	ctx := context.Background()
	eps := make([]*spotEpisode, n)
	type running struct {
		env    string
		target int
		got    *int
	}
	var mu sync.Mutex
	live := map[int]*running{}
	counts := make([]int, n)
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	done := make(chan struct{})
	stopped := make(chan struct{})
	if preempt {
		// The preemptor's own generator: rng is the episodes'.
		prng := rand.New(rand.NewPCG(rng.Uint64(), 40))
		go func() {
			defer close(stopped)
			for {
				select {
				case <-done:
					return
				case <-time.After(time.Duration(500+prng.IntN(1500)) * time.Millisecond):
				}
				// The nodes holding a running episode that wants more
				// preemptions, each as often as such episodes are on it.
				var cands []string
				mu.Lock()
				for _, r := range live {
					if r.env == "" || *r.got >= r.target {
						continue
					}
					if node := sc.placementOf(r.env); node != "" {
						sc.mu.Lock()
						_, ok := sc.nodes[node]
						sc.mu.Unlock()
						if ok {
							cands = append(cands, node)
						}
					}
				}
				mu.Unlock()
				// The cluster back at three first (the last preempted
				// node's replacement registered): a spot fleet whose
				// nodes go faster than new ones come is not what this
				// measures, and with one node left a kill leaves an env
				// no replica to fall back on.
				if len(cands) == 0 || sc.live() < 3 {
					continue
				}
				node := cands[prng.IntN(len(cands))]
				drain := arm == "drain" || arm == "spot" && prng.IntN(2) == 0
				var hit []string
				mu.Lock()
				for _, r := range live {
					if r.env != "" && sc.placementOf(r.env) == node {
						*r.got++
						hit = append(hit, r.env)
					}
				}
				mu.Unlock()
				var reps []string
				for _, env := range hit {
					reps = append(reps, env+": "+sc.replicaOf(env))
				}
				sc.logf("preempt node %s (drain %v), holding episodes %v", node, drain, reps)
				if drain {
					res.drains++
				} else {
					res.kills++
				}
				took := sc.preempt(node, drain)
				if drain {
					res.drainTook = append(res.drainTook, took)
				}
			}
		}()
	} else {
		close(stopped)
	}
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		r := &running{target: 1 + rng.IntN(5), got: &counts[i]}
		mu.Lock()
		live[i] = r
		mu.Unlock()
		task := i % len(spotTasks)
		go func() {
			defer func() { <-sem; wg.Done() }()
			envc := make(chan string, 1)
			go func() {
				if id, ok := <-envc; ok {
					mu.Lock()
					r.env = id
					mu.Unlock()
				}
			}()
			eps[i] = runEpisode(ctx, c, task, steps, think, giveUp, envc)
			close(envc)
			mu.Lock()
			delete(live, i)
			eps[i].preempted = counts[i]
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(done)
	<-stopped
	sc.starting.Wait()
	return eps
}

// BenchmarkSpot is the spot-preemption study (see the knobs above). Run
// it with make spot, or: go test -run '^$' -bench Spot -benchtime 1x
// -timeout 3h ./router/ with ARBOR_BIN and ARBOR_INIT set.
func BenchmarkSpot(b *testing.B) {
	servetest.RequireHost(b)
	n := envInt("SPOT_EPISODES", 20)
	par := envInt("SPOT_PARALLEL", 3)
	steps := envInt("SPOT_STEPS", 8) // hello allows 10 turns: 8, the solution and one replayed
	think := envDur("SPOT_THINK", time.Second)
	ttl := envDur("SPOT_TTL", 2*time.Second)
	arms := strings.Split(cmp.Or(os.Getenv("SPOT_ARMS"), "spot,control"), ",")
	rng := rand.New(rand.NewPCG(uint64(envInt("SPOT_SEED", 1)), 39))
	giveUp := ttl + 20*time.Second
	taskDir := b.TempDir()
	for _, t := range spotTasks {
		raw, err := os.ReadFile(filepath.Join("..", "tasks", t.name+".yaml"))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(taskDir, t.name+".yaml"), raw, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	var log *os.File
	if p := os.Getenv("SPOT_LOG"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		log = f
	}
	load0, commit := loadavg(), gitCommit()
	var results []*spotArm
	for range b.N {
		results = nil
		for _, arm := range arms {
			etcd := etcdtest.Start(b)
			sc := &spotCluster{b: b, etcd: etcd, cli: etcdClient(b, etcd), tasks: taskDir, nodes: map[string]*spotNode{}, log: log,
				args: []string{"--cluster-ttl", ttl.String()}}
			if arm != "control" {
				sc.args = append(sc.args, "--drain-timeout", "10s", "--replicas", "2")
			}
			for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
				sc.start(ip)
			}
			_, addr := startRouter(b, etcd)
			c := dial(b, addr)
			res := &spotArm{name: arm}
			start := time.Now()
			res.base = runPass(b, sc, c, arm, n, par, steps, think, giveUp, rng, false, res)
			res.run = runPass(b, sc, c, arm, n, par, steps, think, giveUp, rng, true, res)
			res.took = time.Since(start)
			sc.mu.Lock()
			res.pauses = slices.Clone(sc.pauses)
			res.startups = slices.Clone(sc.startups)
			for _, node := range sc.nodes {
				node.srv.Kill()
			}
			sc.mu.Unlock()
			results = append(results, res)
			b.Log(res.summary())
		}
	}
	report := spotReport(results, n, par, steps, think, ttl, load0, commit)
	b.Log("\n" + report)
	if p := os.Getenv("SPOT_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(report), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// gitCommit is the tree's commit when the study starts (ARBOR_BIN is
// built from it by make spot), marked when the tree has changes.
func gitCommit() string {
	out, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	c := strings.TrimSpace(string(out))
	if exec.Command("git", "diff", "--quiet", "HEAD").Run() != nil {
		c += " (with uncommitted changes)"
	}
	return c
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

// loadavg is the machine's 1-minute load average.
func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// pct is the p-th percentile of d (sorted in place); 0 for none.
func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(len(d)-1, len(d)*p/100)]
}

// overhead is the mean over the episodes that finished in both passes of
// (wall with preemptions - wall without) / wall with.
func (a *spotArm) overhead() (float64, int) {
	var sum float64
	k := 0
	for i, e := range a.run {
		if e.err != nil || a.base[i].err != nil {
			continue
		}
		sum += float64(e.wall-a.base[i].wall) / float64(e.wall)
		k++
	}
	if k == 0 {
		return 0, 0
	}
	return sum / float64(k), k
}

// spotTally counts an arm's preempted episodes by outcome.
type spotTally struct {
	intact, lost, torn, behind, told, zero, retries int
}

func (a *spotArm) tally() spotTally {
	var t spotTally
	for _, e := range a.run {
		switch {
		case e.intact():
			t.intact++
		case e.err != nil:
			t.lost++
		case e.torn != "":
			t.torn++
		case e.lost > 0:
			t.behind++
			if e.told > 0 {
				t.told++
			}
		}
		if e.err != nil || e.reward != 1 {
			t.zero++
		}
		t.retries += e.retries
	}
	return t
}

func (a *spotArm) summary() string {
	t := a.tally()
	ov, k := a.overhead()
	return fmt.Sprintf("arm %s: %d episodes; %d drains and %d kills: %d intact, %d lost (error), %d torn, %d rolled back, %d scored other than 1 (fake zeros); overhead %.1f%% over %d; migration pause p50 %v p95 %v (%d moves); took %v",
		a.name, len(a.run), a.drains, a.kills, t.intact, t.lost, t.torn, t.behind, t.zero, 100*ov, k,
		pct(a.pauses, 50), pct(a.pauses, 95), len(a.pauses), a.took.Round(time.Second))
}

// spotReport is the markdown table of the arms.
func spotReport(arms []*spotArm, n, par, steps int, think, ttl time.Duration, load0, commit string) string {
	var sb strings.Builder
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	fmt.Fprintf(&sb, "# Spot-preemption study (issue 39)\n\nWritten by `make spot` (router.BenchmarkSpot; docs/cluster.md, \"Spot preemption\") on %s at commit %s%s. Machine: %d CPUs, kernel %s, load average %s at the start and %s at the end (other engineers' tests share it). etcd, the router and three `arbor serve` nodes on 127.0.0.1-4.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), commit, "", runtime.NumCPU(),
		strings.TrimSpace(string(kernel)), load0, loadavg())
	fmt.Fprintf(&sb, "Settings: %d episodes per arm, %d at once, %d counter steps each (plus the solution halfway and evaluate), think time %v between steps, --cluster-ttl %v; tasks %s.\n\n",
		n, par, steps, think, ttl, strings.Join([]string{spotTasks[0].name, spotTasks[1].name}, ", "))
	sb.WriteString("| arm | episodes | preemptions (drain / kill -9) | per episode (min-max) | intact | lost (error) | torn | rolled back (told) | fake zeros | overhead (mean) | migration pause p50 / p95 (moves) | drain, SIGTERM to exit p50 / p95 | longest step of a preempted episode p50 / p95 | wall, no preemption p50 | wall, preempted p50 | fresh node start p50 | retries |\n")
	sb.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, a := range arms {
		t := a.tally()
		lo, hi := 1<<30, 0
		var bw, rw, stalls []time.Duration
		for i, e := range a.run {
			lo, hi = min(lo, e.preempted), max(hi, e.preempted)
			bw = append(bw, a.base[i].wall)
			rw = append(rw, e.wall)
			if e.preempted > 0 {
				stalls = append(stalls, e.stall)
			}
		}
		ov, k := a.overhead()
		fmt.Fprintf(&sb, "| %s | %d | %d / %d | %d-%d | %d | %d | %d | %d (%d) | %d | %.1f%% (%d) | %v / %v (%d) | %v / %v | %v / %v | %v | %v | %v | %d |\n",
			a.name, len(a.run), a.drains, a.kills, lo, hi, t.intact, t.lost, t.torn, t.behind, t.told, t.zero, 100*ov, k,
			pct(a.pauses, 50).Round(time.Millisecond), pct(a.pauses, 95).Round(time.Millisecond), len(a.pauses),
			pct(a.drainTook, 50).Round(time.Millisecond), pct(a.drainTook, 95).Round(time.Millisecond),
			pct(stalls, 50).Round(time.Millisecond), pct(stalls, 95).Round(time.Millisecond),
			pct(bw, 50).Round(time.Millisecond), pct(rw, 50).Round(time.Millisecond), pct(a.startups, 50).Round(time.Millisecond), t.retries)
	}
	sb.WriteString(`
Columns: *intact*: the episode finished, every counter step found the file counter and the shell variable it left (equal, and one more than the step before), and evaluate gave the reward it gives without preemptions (1). *lost*: a request failed past the client's retries (retryable infra errors retried for the TTL + 20 s), so the episode could not finish: what a trainer scores as a fake zero or masks. *torn*: a step found the file and the shell of different turns, or a turn that ran twice. *rolled back*: the env came back at an older state than its last answered step (a replica behind the env's head): the counter went on from there (the client replays what was lost), the turns counted as lost; *told*: of those, the ones an answer said so to (info.recovered). *fake zeros*: the episodes lost or scored other than 1. *overhead*: the mean over the episodes finished in both passes of (wall with preemptions - wall of the same episode without) / wall with. *migration pause*: the pause every move logged by the nodes (` + "`migrated env ... pause=`" + `), drains' moves. *longest step*: the longest round trip of a step (retries included) in each preempted episode: for a kill, the wait for the lease to end and the restore.
`)
	for _, a := range arms {
		t := a.tally()
		ov, _ := a.overhead()
		fmt.Fprintf(&sb, "\nArm %s: episodes intact %d/%d (target 100%%: %s); overhead %.1f%% (target under 2%%: %s); fake zeros %d/%d.\n",
			a.name, t.intact, len(a.run), met(t.intact == len(a.run)), 100*ov, met(ov < 0.02), t.zero, len(a.run))
	}
	sb.WriteString("\nEpisodes not intact:\n\n")
	for _, a := range arms {
		for pass, eps := range [][]*spotEpisode{a.base, a.run} {
			for i, e := range eps {
				if !e.intact() {
					fmt.Fprintf(&sb, "* %s #%d %s (%s, env %s, %d preemptions): err=%v torn=%q turns lost=%d (told %d) reward=%v\n",
						a.name, i, []string{"without preemption", "preempted"}[pass], spotTasks[e.task].name, e.env, e.preempted, e.err, e.torn, e.lost, e.told, e.reward)
				}
			}
		}
	}
	return sb.String()
}
