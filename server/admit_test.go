package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/branch"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// admitRig is a server whose steps admission control bounds tightly: two
// at once, a wait of at most 2 s; each step of the test is 0.5 s of
// server work (serverWork), so about 8 waiters fit the bound.
func admitRig(t *testing.T) (string, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	_, addr := newServerWith(t, server.Options{Registry: reg, MaxInFlight: 1024},
		coordinator.Options{Classify: classifySlow(state.None), AdmitWait: 2 * time.Second, AdmitSlots: coordinator.Slots{Step: 2}})
	return addr, reg
}

// serverWork is a command whose turn costs the server d of work while
// holding its step slot (classifySlow's classification takes d), the
// command itself nothing: a command's own run gives its slot back
// (TestLongCommandsDoNotHoldSlots).
func serverWork(d time.Duration) arbor.Action {
	return arbor.Bash("# server work "+d.String(), 0)
}

// classifySlow classifies every turn k, taking the time a serverWork
// command names.
func classifySlow(k state.Kind) func(context.Context, *branch.Env, string) (branch.Turn, error) {
	return func(ctx context.Context, _ *branch.Env, cmd string) (branch.Turn, error) {
		if v, ok := strings.CutPrefix(cmd, "# server work "); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				return branch.Turn{}, err
			}
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return branch.Turn{}, ctx.Err()
			}
		}
		return branch.Turn{Kind: k}, nil
	}
}

// stepBusy reads arbor_admit_busy_total{class="step"}.
func stepBusy(t *testing.T, reg *prometheus.Registry) float64 {
	return stepMetric(t, reg, "arbor_admit_busy_total")
}

// stepMetric reads the series {class="step"} of a counter or gauge.
func stepMetric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "class" && l.GetValue() == coordinator.ClassStep {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{class=\"step\"} in the registry", name)
	return 0
}

func resetN(t testing.TB, c *arbor.Client, n int) []string {
	t.Helper()
	envs := make([]string, n)
	for i := range envs {
		r, err := c.Reset(context.Background(), arbor.ResetParams{Image: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		envs[i] = r.EnvID
	}
	return envs
}

// TestAdmissionFloodIsFair: one client floods steps on 12 envs (each
// env's steps pipelined), more than the step slots and the wait bound
// hold; meanwhile a second client with one env steps one step at a time.
// (a) Every step of the second client is admitted: round robin serves it
// after at most one of the flood's, well within the bound. (b) The flood
// gets busy answers (too_many_requests, retryable, with retry_after_ms)
// rather than waiting without bound, and the server counts them. (c)
// Every request is answered, ok or busy, nothing else. Then the same
// flood from a client that backs off (the Go client's default) ends with
// every step done.
func TestAdmissionFloodIsFair(t *testing.T) {
	addr, reg := admitRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	noRetry := &arbor.Options{BusyRetries: -1}
	big, small := dial(t, addr, noRetry), dial(t, addr, noRetry)
	bigEnvs, smallEnv := resetN(t, big, 12), resetN(t, small, 1)[0]
	before := stepBusy(t, reg)

	const perEnv = 2
	type answer struct {
		env  string
		err  error
		took time.Duration
	}
	start := time.Now()
	var pend []*arbor.Pending
	var pendEnv []string
	for range perEnv {
		for _, env := range bigEnvs {
			p, err := big.Send(protocol.MethodStep, protocol.StepParams{EnvID: env, Action: serverWork(500 * time.Millisecond)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			pend, pendEnv = append(pend, p), append(pendEnv, env)
		}
	}
	answers := make(chan answer, len(pend))
	for i, p := range pend {
		go func() { err := p.Wait(ctx, nil); answers <- answer{pendEnv[i], err, time.Since(start)} }()
	}

	// The second client, while the flood runs.
	var smallErrs []error
	var smallMax time.Duration // the slowest step of the second client (logged)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 3 {
			t0 := time.Now()
			_, err := small.Step(ctx, smallEnv, serverWork(500*time.Millisecond))
			smallErrs = append(smallErrs, err)
			smallMax = max(smallMax, time.Since(t0))
		}
	}()

	ok, busy := 0, 0
	var busyMax time.Duration // the latest busy answer, since the flood began (logged)
	for range pend {
		a := <-answers
		var pe *arbor.Error
		switch {
		case a.err == nil:
			ok++
		case errors.As(a.err, &pe) && pe.Code == protocol.CodeTooManyReqs:
			busy++
			busyMax = max(busyMax, a.took)
			if !pe.Retryable || pe.RetryAfterMS <= 0 {
				t.Errorf("busy answer of env %s without a retry hint: %+v", a.env, pe)
			}
		default:
			t.Errorf("flood step on env %s: %v, want ok or too_many_requests", a.env, a.err)
		}
	}
	wg.Wait()
	for i, err := range smallErrs {
		if err != nil {
			t.Errorf("step %d of the client with one env: %v, want it admitted", i, err)
		}
	}
	t.Logf("flood: %d ok, %d busy of %d in %v (last busy answer at %v); the one-env client's slowest step %v (0.5 s of server work, bound 2 s)",
		ok, busy, len(pend), time.Since(start).Round(time.Millisecond), busyMax.Round(time.Millisecond), smallMax.Round(time.Millisecond))
	if busy == 0 {
		t.Errorf("no busy answer to %d steps on %d envs over 2 slots and a 2 s bound", len(pend), len(bigEnvs))
	}
	if ok == 0 {
		t.Error("no step of the flood admitted")
	}
	if got := stepBusy(t, reg) - before; got != float64(busy) {
		t.Errorf("arbor_admit_busy_total{class=step} rose by %v, the clients saw %d busy answers", got, busy)
	}

	// The same flood from a client that backs off on busy: every step
	// ends done, and the server refused some of them on the way.
	backing := dial(t, addr, &arbor.Options{BusyRetries: 100, BusyMaxWait: 2 * time.Minute})
	before = stepBusy(t, reg)
	errs := make(chan error, len(bigEnvs))
	for _, env := range bigEnvs {
		go func() {
			_, err := backing.Step(ctx, env, serverWork(500*time.Millisecond))
			errs <- err
		}()
	}
	for range bigEnvs {
		if err := <-errs; err != nil {
			t.Errorf("step of a client that backs off: %v", err)
		}
	}
	// 12 steps at once over 2 slots and about 8 waiters' room: some are
	// refused, so the client did retry them.
	refused := stepBusy(t, reg) - before
	if refused == 0 {
		t.Error("the second flood met no busy answer: the client's back-off was not exercised")
	}
	t.Logf("the backing-off flood was refused %v times and retried to completion", refused)
}

// TestLongCommandsDoNotHoldSlots: a step's command runs on its
// sandbox's CPU, so past a second it stops holding one of the server's
// step slots: with one slot, three envs whose commands sleep longer than
// the admission bound, another env's steps are served, not refused busy
// (before, a few long commands made every other env's step busy), and
// the long steps still end well, each classified and committed after its
// command.
func TestLongCommandsDoNotHoldSlots(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, addr := newServerWith(t, server.Options{Registry: reg},
		coordinator.Options{Classify: classifyAs(state.None), AdmitWait: 5 * time.Second, AdmitSlots: coordinator.Slots{Step: 1}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dial(t, addr, &arbor.Options{BusyRetries: -1})
	envs := resetN(t, c, 4)
	var long []*arbor.Pending
	for _, env := range envs[:3] {
		p, err := c.Send(protocol.MethodStep, protocol.StepParams{EnvID: env, Action: arbor.Bash("sleep 12; echo slept", 0)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		long = append(long, p)
	}
	time.Sleep(500 * time.Millisecond) // the long commands are running
	for i := range 3 {
		r, err := c.Step(ctx, envs[3], arbor.Bash("echo hi", 0))
		if err != nil {
			t.Fatalf("step %d of the fourth env while three commands sleep 12 s over one slot, a bound of 5 s: %v, want it served", i, err)
		}
		if got := string(r.Obs.Stdout); got != "hi\n" {
			t.Errorf("step %d: stdout %q", i, got)
		}
	}
	for i, p := range long {
		var r protocol.StepResult
		if err := p.Wait(ctx, &r); err != nil {
			t.Fatalf("long step %d: %v", i, err)
		}
		if got := string(r.Obs.Stdout); got != "slept\n" || r.Info.StateID == "" {
			t.Errorf("long step %d: stdout %q, state %q", i, got, r.Info.StateID)
		}
	}
	if got := stepBusy(t, reg); got != 0 {
		t.Errorf("%v steps refused busy, want none", got)
	}
}

// TestAdmissionBusyOverHTTP: OpenEnv's HTTP step route answers a busy
// admission with 429, a Retry-After header and v1's code and hint in its
// body; once the slot is free the same step is served.
func TestAdmissionBusyOverHTTP(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, addr := newServerWith(t, server.Options{Registry: reg},
		coordinator.Options{Classify: classifySlow(state.None), AdmitWait: 300 * time.Millisecond, AdmitSlots: coordinator.Slots{Step: 1}})
	base := "http://" + addr + "/openenv/count"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code, r := oePost(t, base+"/reset", map[string]any{})
	_, meta, _, _ := obsOf(t, r)
	sess, _ := meta["session_id"].(string)
	if code != 200 || sess == "" {
		t.Fatalf("POST reset: %d %v", code, r)
	}

	// A v1 step holds the one step slot for 5 s.
	c := dial(t, addr, nil)
	env := resetN(t, c, 1)[0]
	hold, err := c.Send(protocol.MethodStep, protocol.StepParams{EnvID: env, Action: serverWork(5 * time.Second)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for stepMetric(t, reg, "arbor_admit_running") < 1 {
		if ctx.Err() != nil {
			t.Fatal("the v1 step never held the slot")
		}
		time.Sleep(10 * time.Millisecond)
	}

	step := func() (*http.Response, map[string]any) {
		b, _ := json.Marshal(map[string]any{"action": bash("echo hi"), "session_id": sess})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/step", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatalf("POST step: %d, body not JSON: %v", resp.StatusCode, err)
		}
		return resp, m
	}
	resp, m := step()
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || err != nil || ra < 1 {
		t.Errorf("POST step while the slot is held: %d Retry-After %q, want 429 and whole seconds", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if ms, _ := m["retry_after_ms"].(float64); m["arbor_code"] != protocol.CodeTooManyReqs || m["retryable"] != true || ms <= 0 {
		t.Errorf("busy body %v, want arbor_code too_many_requests, retryable, retry_after_ms", m)
	}

	if err := hold.Wait(ctx, nil); err != nil {
		t.Fatalf("the v1 step that held the slot: %v", err)
	}
	if resp, m := step(); resp.StatusCode != 200 {
		t.Errorf("POST step with the slot free: %d %v", resp.StatusCode, m)
	}
}

// BenchmarkAdmitFlood: 48 envs of one client each step 3 times (sleep
// 0.2 s) at once over 4 step slots (20 steps/s at most), with the
// default 1 s bound and without one. A busy step is sent again after
// its retry_after_ms by the env's loop (so the attempts show). Reported:
// the latency of the steps that ran (p50, p99, max), the busy answers,
// and the steps per second.
func BenchmarkAdmitFlood(b *testing.B) {
	for _, bc := range []struct {
		name string
		wait time.Duration
	}{{"bound=1s", time.Second}, {"unbounded", -1}} {
		b.Run(bc.name, func(b *testing.B) {
			_, addr := newServerWith(b, server.Options{MaxInFlight: 1024},
				coordinator.Options{Classify: classifySlow(state.None), AdmitWait: bc.wait, AdmitSlots: coordinator.Slots{Step: 4}})
			ctx := context.Background()
			c := dial(b, addr, &arbor.Options{BusyRetries: -1})
			envs := resetN(b, c, 48)
			for range b.N {
				var mu sync.Mutex
				var lat []time.Duration
				busy := 0
				var wg sync.WaitGroup
				start := time.Now()
				for _, env := range envs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for done := 0; done < 3; {
							t0 := time.Now()
							_, err := c.Step(ctx, env, serverWork(200*time.Millisecond))
							var pe *arbor.Error
							switch {
							case err == nil:
								done++
								mu.Lock()
								lat = append(lat, time.Since(t0))
								mu.Unlock()
							case errors.As(err, &pe) && pe.RetryAfterMS > 0:
								mu.Lock()
								busy++
								mu.Unlock()
								time.Sleep(pe.RetryAfter())
							default:
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				took := time.Since(start)
				b.ReportMetric(float64(percentile(lat, .5).Milliseconds()), "p50-ms")
				b.ReportMetric(float64(percentile(lat, .99).Milliseconds()), "p99-ms")
				b.ReportMetric(float64(percentile(lat, 1).Milliseconds()), "max-ms")
				b.ReportMetric(float64(busy), "busy")
				b.ReportMetric(float64(len(lat))/took.Seconds(), "steps/s")
			}
		})
	}
}
