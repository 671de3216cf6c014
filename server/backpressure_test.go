package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/server/protocol"
)

// Slow-reader tests: answers of answerBytes each against a budget of
// unread bytes of a few answers.
const (
	answerBytes = 1 << 20
	unreadLimit = 4 << 20
)

// smallBuffers makes a listener's connections keep at most 64 KiB in
// their socket send buffers, so that answers a client does not read stay
// in the server's books instead of the kernel's.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(64 << 10)
	}
	return c, err
}

// backpressureServer serves with a 4 MiB budget of unread bytes on a
// listener with small socket buffers; it returns the server, its address
// and its metrics.
func backpressureServer(t *testing.T, o server.Options) (*server.Server, string, *prometheus.Registry) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	reg := prometheus.NewRegistry()
	c, err := coordinator.New(coordinator.Options{Engine: engine, Tasks: coordinator.FromEnvpool(pool), Classify: coordinator.Full,
		Logger: quiet(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	o.Coordinator, o.Logger, o.Registry = c, quiet(), reg
	o.MaxUnreadBytes, o.MaxFrameBytes = unreadLimit, 256<<10
	s, err := server.New(o)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(s.Handler())
	hs.Listener = smallBuffers{hs.Listener}
	hs.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		hs.Close()
		c.Close()
	})
	return s, strings.TrimPrefix(hs.URL, "http://"), reg
}

// slowReader is a raw websocket whose socket receive buffer is 64 KiB:
// what it does not read backs up into the server.
func slowReader(t *testing.T, addr string) *raw {
	t.Helper()
	d := websocket.Dialer{NetDial: func(network, addr string) (net.Conn, error) {
		c, err := net.Dial(network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(64 << 10)
		}
		return c, err
	}}
	ws, _, err := d.Dial("ws://"+addr+"/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return &raw{t: t, ws: ws}
}

// resetRaw resets a busybox env over r (msgid 1) and closes it at the end.
func resetRaw(t *testing.T, r *raw) string {
	t.Helper()
	r.req(1, protocol.MethodReset, map[string]any{"image": "busybox"})
	f := r.recv()
	if f.Error != nil {
		t.Fatalf("reset: %v", f.Error)
	}
	var res protocol.ResetResult
	if err := msgpack.Unmarshal(f.Result, &res); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e, err := engine.Env(res.EnvID); err == nil {
			engine.CloseEnv(context.Background(), e)
		}
	})
	return res.EnvID
}

// bigStep asks for a step whose stdout is answerBytes of one letter
// (msgid's, so that answers cannot be mixed up).
func bigStep(r *raw, id uint32, env string) {
	r.req(id, protocol.MethodStep, map[string]any{"env_id": env, "action": map[string]any{
		"tool": "bash", "cmd": fmt.Sprintf("head -c %d /dev/zero | tr '\\0' %c", answerBytes, 'a'+id%26),
		"max_output": answerBytes}})
}

// readBigSteps reads the answers to the steps of msgids first..last, in
// any order, and checks each: its output, and its turn (the steps ran in
// the order sent, one per turn after the reset).
func readBigSteps(t *testing.T, r *raw, first, last uint32) {
	t.Helper()
	seen := map[uint32]bool{}
	for range last - first + 1 {
		f := r.recv()
		if f.Type != protocol.Response || f.MsgID < first || f.MsgID > last || seen[f.MsgID] {
			t.Fatalf("frame type %d msgid %d: want one answer to each of %d..%d", f.Type, f.MsgID, first, last)
		}
		seen[f.MsgID] = true
		if f.Error != nil {
			t.Fatalf("step %d: %v", f.MsgID, f.Error)
		}
		var res protocol.StepResult
		if err := msgpack.Unmarshal(f.Result, &res); err != nil {
			t.Fatal(err)
		}
		want := strings.Repeat(string(rune('a'+f.MsgID%26)), answerBytes)
		if string(res.Obs.Stdout) != want || res.Obs.Truncated {
			t.Errorf("step %d: %d bytes of stdout (truncated %v), want %d of %q", f.MsgID, len(res.Obs.Stdout), res.Obs.Truncated, answerBytes, want[:1])
		}
		if res.Info.Turn != int(f.MsgID-1) {
			t.Errorf("step %d ran at turn %d, want %d", f.MsgID, res.Info.Turn, f.MsgID-1)
		}
	}
}

// stepsAnswered reads arbor_requests_total{method="step"}, all codes.
func stepsAnswered(t *testing.T, reg *prometheus.Registry) int64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "arbor_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && l.GetValue() == protocol.MethodStep {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int64(n)
}

// backlog is the one connection's backlog.
func backlog(t *testing.T, s *server.Server) server.Backlog {
	t.Helper()
	b := s.Backlogs()
	if len(b) != 1 {
		t.Fatalf("%d connections, want 1", len(b))
	}
	return b[0]
}

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestSlowReaderBounded: a client pipelines many steps with 1 MiB
// answers and reads none. The server runs them until the answers it holds
// for the client reach MaxUnreadBytes, then starts no more: what it holds
// stays under the budget plus one answer, and so does the growth of its
// heap (before, every answer was held: 48 MiB). Once the client reads,
// every answer arrives, in full, from steps run in the order sent.
func TestSlowReaderBounded(t *testing.T) {
	s, addr, reg := backpressureServer(t, server.Options{})
	r := slowReader(t, addr)
	env := resetRaw(t, r)
	base := heapAlloc()
	start := time.Now()
	const n = 48
	for id := uint32(2); id < 2+n; id++ {
		bigStep(r, id, env)
	}
	// Wait until a step is held back (the others queue behind it on the
	// env), or all ran: then the server holds all it ever will for this
	// client.
	deadline := time.Now().Add(time.Minute)
	for {
		b := backlog(t, s)
		if b.Gated > 0 || stepsAnswered(t, reg) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("steps neither answered nor held back: %d answered, %+v", stepsAnswered(t, reg), b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	grown := int64(heapAlloc()) - int64(base)
	b := backlog(t, s)
	t.Logf("unread: %d steps answered, %d held back, %d bytes held (peak %d), heap grew %d bytes, %v after the reset",
		stepsAnswered(t, reg), b.Gated, b.Held, b.Peak, grown, time.Since(start).Round(time.Millisecond))
	if g := gauge(t, reg, "arbor_unread_bytes"); int64(g) != b.Held {
		t.Errorf("arbor_unread_bytes %v, want the connection's %d", g, b.Held)
	}
	if limit := int64(unreadLimit + 2*answerBytes + 4<<20); grown > limit {
		t.Errorf("heap grew by %d bytes with %d answers unread, want under %d (budget %d, answers of %d)",
			grown, stepsAnswered(t, reg), limit, unreadLimit, answerBytes)
	}
	readBigSteps(t, r, 2, 1+n)
	// The writer counts a frame written once its write returned, which
	// may be after the client has it.
	for deadline := time.Now().Add(10 * time.Second); backlog(t, s).Held != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	b = backlog(t, s)
	if limit := int64(unreadLimit + answerBytes + 4096); b.Peak > limit {
		t.Errorf("the connection held up to %d bytes of unread answers, want at most %d (budget %d + one answer)", b.Peak, limit, unreadLimit)
	}
	if b.Held != 0 || b.Gated != 0 || b.Paused {
		t.Errorf("after the client read everything: %+v, want nothing held", b)
	}
	if g := gauge(t, reg, "arbor_unread_bytes"); g != 0 {
		t.Errorf("arbor_unread_bytes %v after the client read everything", g)
	}
}

// TestPausedClientKeptAcrossPongWait: a connection over its budget reads
// nothing, so it sees no pong either; that must not count as silence.
// The client sends a step every 100 ms (frames prove it is there) without
// reading; once the server stopped reading it, the client stays silent
// for 3 PongWaits, and is still served: every answer arrives when it
// reads, also those of the steps it sent while the server did not read.
func TestPausedClientKeptAcrossPongWait(t *testing.T) {
	// Long enough that a loaded machine does not stall the client's
	// sends for a whole PongWait before the server pauses it (a 1 s one
	// dropped it once in make test).
	const pongWait = 3 * time.Second
	s, addr, _ := backpressureServer(t, server.Options{PingInterval: 100 * time.Millisecond, PongWait: pongWait})
	r := slowReader(t, addr)
	env := resetRaw(t, r)
	id := uint32(2)
	deadline := time.Now().Add(2 * time.Minute)
	for ; !backlog(t, s).Paused; id++ {
		if time.Now().After(deadline) || id > 250 { // under MaxInFlight
			t.Fatalf("%d steps of %d bytes unread and the server still reads: %+v", id-2, answerBytes, backlog(t, s))
		}
		bigStep(r, id, env)
		time.Sleep(100 * time.Millisecond)
	}
	bigStep(r, id, env) // sent while the server does not read
	time.Sleep(3 * pongWait)
	if b := backlog(t, s); !b.Paused {
		t.Errorf("after 3 PongWaits: %+v, want the read loop still waiting for the client", b)
	}
	readBigSteps(t, r, 2, id)
}

// TestNeverReaderDropped: a client that reads none of its answers is
// dropped once a frame write has waited WriteWait; the steps it sent
// still run (only their answers are lost), so the env is at their turn.
func TestNeverReaderDropped(t *testing.T) {
	s, addr, _ := backpressureServer(t, server.Options{WriteWait: time.Second})
	r := slowReader(t, addr)
	env := resetRaw(t, r)
	const n = 16
	for id := uint32(2); id < 2+n; id++ {
		bigStep(r, id, env)
	}
	deadline := time.Now().Add(time.Minute)
	for len(s.Backlogs()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a client that reads nothing is still connected: %+v", s.Backlogs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := dial(t, addr, nil)
	res := sh(t, c, env, "echo hi")
	if res.Info.Turn != n+1 {
		t.Errorf("after the drop the env is at turn %d, want %d: the dropped client's steps all ran", res.Info.Turn, n+1)
	}
}

// TestAnswerMemoryBounded: two clients pipeline steps with 1 MiB answers
// and read none; a third does the same and reads. Each connection's own
// budget (4 MiB) would let the server hold 8 MiB and more for the first
// two; the server-wide MaxAnswerBytes (6 MiB here) holds what all hold,
// reservations of running steps included, to the bound plus one step's
// reservation. The reading client's steps wait for room, and the server
// makes it by dropping a client that took none of its answers for 2 s and
// holds more than its share: every answer of the reading client arrives,
// in full and in order.
func TestAnswerMemoryBounded(t *testing.T) {
	const bound = 6 << 20
	// WriteWait well past the test: here only the answer budget may drop
	// a client (under load WriteWait's 30 s dropped both non-readers
	// before their answers reached 4 MiB).
	s, addr, reg := backpressureServer(t, server.Options{MaxAnswerBytes: bound, WriteWait: 10 * time.Minute})
	const n = 6
	var rs []*raw
	var envs []string
	for range 3 {
		r := slowReader(t, addr)
		rs = append(rs, r)
		envs = append(envs, resetRaw(t, r))
	}
	for i, r := range rs[:2] {
		for id := uint32(2); id < 2+n; id++ {
			bigStep(r, id, envs[i])
		}
	}
	// Until what they do not read (not counting reservations) leaves no
	// room for another step's 2 MiB.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		held, _, _ := s.AnswerMemory()
		if gauge(t, reg, "arbor_unread_bytes") >= 4*answerBytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d steps answered, %d bytes held after a minute", stepsAnswered(t, reg), held)
		}
		time.Sleep(20 * time.Millisecond)
	}
	held, _, _ := s.AnswerMemory()
	t.Logf("the non-readers: %d steps answered, %d bytes held of a %d bound", stepsAnswered(t, reg), held, bound)
	if g := gauge(t, reg, "arbor_answer_bytes"); int64(g) != held {
		t.Errorf("arbor_answer_bytes %v, want %d", g, held)
	}
	reader := rs[2]
	for id := uint32(2); id < 2+n; id++ {
		bigStep(reader, id, envs[2])
	}
	readBigSteps(t, reader, 2, 1+n)
	for deadline := time.Now().Add(10 * time.Second); len(s.Backlogs()) > 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if conns := len(s.Backlogs()); conns > 2 {
		t.Errorf("%d connections after the reader's steps: want a non-reader dropped", conns)
	}
	_, peak, _ := s.AnswerMemory()
	// One step runs whatever is held when nothing is; a queued frame and
	// a step's reservation overlap for the moment between them.
	if limit := int64(bound + 2*answerBytes + 64<<10 + answerBytes + 4096); peak > limit {
		t.Errorf("the server held up to %d bytes of answers, want at most %d (bound %d)", peak, limit, bound)
	}
	t.Logf("peak %d bytes held", peak)
}
