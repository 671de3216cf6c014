package arbor_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/vmihailenco/msgpack/v5"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server/protocol"
)

// fakeServer answers each batch of three requests in reverse order, and
// never answers method "hang".
func fakeServer(t *testing.T) string {
	up := websocket.Upgrader{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		var batch []protocol.Frame
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			f, err := protocol.DecodeFrame(b)
			if err != nil || f.Method == "hang" {
				continue
			}
			batch = append(batch, f)
			if len(batch) < 3 {
				continue
			}
			for i := len(batch) - 1; i >= 0; i-- {
				f := batch[i]
				var out []byte
				if f.Method == "fail" {
					out, _ = protocol.EncodeResponse(f.MsgID, protocol.Errorf(protocol.CodeUnknownEnv, "no"), nil)
				} else {
					var p protocol.CheckpointParams
					if err := protocol.DecodeParams(f.Params, &p); err != nil {
						t.Error(err)
					}
					out, _ = protocol.EncodeResponse(f.MsgID, nil, protocol.CheckpointResult{StateID: p.EnvID})
				}
				ws.WriteMessage(websocket.BinaryMessage, out)
			}
			batch = nil
		}
	}))
	t.Cleanup(hs.Close)
	return strings.TrimPrefix(hs.URL, "http://")
}

func TestPipelined(t *testing.T) {
	c, err := arbor.Dial(context.Background(), fakeServer(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Call(ctx, "hang", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hang: %v", err)
	}
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sid, err := c.Checkpoint(context.Background(), id)
			if err != nil || sid != id {
				t.Errorf("checkpoint %s: %q %v", id, sid, err)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	if err := c.CloseEnv(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for range 2 {
		go c.Checkpoint(context.Background(), "y")
	}
	time.Sleep(50 * time.Millisecond)
	if err := c.Call(context.Background(), "fail", nil, nil); !errors.Is(err, arbor.ErrUnknownEnv) || arbor.IsInfra(err) {
		t.Fatalf("fail: %v", err)
	}
}

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7878":       "ws://127.0.0.1:7878/v1/ws",
		"http://h:1":           "ws://h:1/v1/ws",
		"https://h":            "wss://h/v1/ws",
		"ws://h:2/custom/path": "ws://h:2/custom/path",
	} {
		if got := arbor.URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSendWait: requests sent with Send reach the server in the order
// sent, and each Wait gets its own answer, whatever order they come in
// (the fake server answers three at a time, last first); a raw result
// stays undecoded.
func TestSendWait(t *testing.T) {
	c, err := arbor.Dial(context.Background(), fakeServer(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ps []*arbor.Pending
	for _, id := range []string{"x", "y"} {
		p, err := c.Send(protocol.MethodCheckpoint, protocol.EnvParams{EnvID: id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	failed, err := c.Send("fail", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := failed.Wait(ctx, nil); !errors.Is(err, arbor.ErrUnknownEnv) {
		t.Errorf("fail: %v", err)
	}
	var raw msgpack.RawMessage
	if err := ps[1].Wait(ctx, &raw); err != nil {
		t.Fatal(err)
	}
	var r protocol.CheckpointResult
	if err := msgpack.Unmarshal(raw, &r); err != nil || r.StateID != "y" {
		t.Errorf("raw result of y: %+v %v", r, err)
	}
	if err := ps[0].Wait(ctx, &r); err != nil || r.StateID != "x" {
		t.Errorf("x: %+v %v", r, err)
	}
}
