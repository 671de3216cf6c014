package server_test

import (
	"context"
	"errors"
	"net"
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

// connections reads the server's arbor_connections gauge.
func connections(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	return gauge(t, reg, "arbor_connections")
}

// gauge reads the server's gauge called name.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s metric", name)
	return 0
}

// TestHalfOpenClientDropped: a client that completed the handshake and
// then went silent (it reads nothing, so it answers no ping) is dropped
// once PongWait passes without a frame from it; the step it left running
// finishes, and the env goes on for the next client.
func TestHalfOpenClientDropped(t *testing.T) {
	reg := prometheus.NewRegistry()
	const pongWait = 300 * time.Millisecond
	_, addr := newServer(t, server.Options{PingInterval: 50 * time.Millisecond, PongWait: pongWait, Registry: reg})
	// A gorilla connection answers pings only while something reads it;
	// this one is read only until the reset's answer.
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	send := func(id uint32, method string, params any) {
		b, err := protocol.EncodeRequest(id, method, params)
		if err != nil {
			t.Fatal(err)
		}
		if err := ws.WriteMessage(websocket.BinaryMessage, b); err != nil {
			t.Fatal(err)
		}
	}
	send(1, protocol.MethodReset, map[string]any{"image": "busybox"})
	_, b, err := ws.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	f, err := protocol.DecodeFrame(b)
	if err != nil || f.Error != nil {
		t.Fatalf("reset: %v %v", err, f.Error)
	}
	var reset protocol.ResetResult
	if err := msgpack.Unmarshal(f.Result, &reset); err != nil {
		t.Fatal(err)
	}
	env := reset.EnvID
	t.Cleanup(func() {
		if e, err := engine.Env(env); err == nil {
			engine.CloseEnv(context.Background(), e)
		}
	})
	send(2, protocol.MethodStep, map[string]any{"env_id": env,
		"action": map[string]any{"tool": "bash", "cmd": "sleep 0.5; echo done > /tmp/mark"}})
	silent := time.Now()

	deadline := silent.Add(100 * pongWait)
	for connections(t, reg) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a client silent for %v is still connected (PongWait %v)", time.Since(silent), pongWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("silent client dropped after %v (PongWait %v)", time.Since(silent).Round(time.Millisecond), pongWait)
	// The client sees it too: what was queued for it, then the end.
	ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the server dropped the client from its books but left the connection open")
			}
			break
		}
	}

	c := dial(t, addr, nil)
	r := sh(t, c, env, "cat /tmp/mark")
	if got := strings.TrimSpace(string(r.Obs.Stdout)); got != "done" || r.Info.Turn != 2 {
		t.Errorf("after the drop: %q at turn %d, want the abandoned step's mark at turn 2", got, r.Info.Turn)
	}
}

// TestLiveClientKeptAcrossPings: the Go client answers the server's pings
// while it idles, so it stays connected across several PongWaits.
func TestLiveClientKeptAcrossPings(t *testing.T) {
	reg := prometheus.NewRegistry()
	// PongWait leaves a loaded machine time to schedule the client's
	// reader; the idle spans 3 of them, 60 pings.
	const pongWait = time.Second
	_, addr := newServer(t, server.Options{PingInterval: 50 * time.Millisecond, PongWait: pongWait, Registry: reg})
	ctx := context.Background()
	c := dial(t, addr, nil)
	if _, err := c.Hello(ctx, ""); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * pongWait) // idle: only pings and pongs on the wire
	if _, err := c.Hello(ctx, ""); err != nil {
		t.Fatalf("after idling for 3 PongWaits: %v", err)
	}
	if n := connections(t, reg); n != 1 {
		t.Errorf("%v connections, want the one", n)
	}
}

// TestKeepaliveOptions: PongWait must leave room for a ping's answer.
func TestKeepaliveOptions(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	c, err := coordinator.New(coordinator.Options{Engine: engine, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = server.New(server.Options{Coordinator: c, PingInterval: time.Second, PongWait: time.Second})
	if err == nil {
		t.Fatal("PongWait equal to PingInterval was accepted")
	}
}
