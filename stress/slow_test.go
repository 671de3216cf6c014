package stress

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"time"

	"github.com/gorilla/websocket"
	"github.com/vmihailenco/msgpack/v5"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// raw is a websocket client that writes protocol frames itself and
// reads only when told: a slow reader, a client that sends duplicate
// msgids or frames that are not msgpack.
type raw struct {
	ws   *websocket.Conn
	hang time.Duration
}

func dialRaw(ctx context.Context, addr string, hang time.Duration) (*raw, error) {
	d := websocket.Dialer{HandshakeTimeout: hang}
	ws, _, err := d.DialContext(ctx, arbor.URL(addr), nil)
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(1 << 30)
	return &raw{ws: ws, hang: hang}, nil
}

func (r *raw) send(id uint32, method string, params any) error {
	b, err := protocol.EncodeRequest(id, method, params)
	if err != nil {
		return err
	}
	r.ws.SetWriteDeadline(time.Now().Add(r.hang))
	return r.ws.WriteMessage(websocket.BinaryMessage, b)
}

// read returns the next response or notification.
func (r *raw) read() (protocol.Frame, error) {
	r.ws.SetReadDeadline(time.Now().Add(r.hang))
	_, b, err := r.ws.ReadMessage()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("%w: %v", context.DeadlineExceeded, err)
		}
		return protocol.Frame{}, err
	}
	return protocol.DecodeFrame(b)
}

// response reads until the response to id (notifications are skipped).
func (r *raw) response(id uint32) (protocol.Frame, error) {
	for {
		f, err := r.read()
		if err != nil || (f.Type == protocol.Response && f.MsgID == id) {
			return f, err
		}
	}
}

// call sends a request and waits for its answer, decoding the result
// into result.
func (r *raw) call(id uint32, method string, params, result any) error {
	if err := r.send(id, method, params); err != nil {
		return err
	}
	f, err := r.response(id)
	if err != nil {
		return err
	}
	if f.Error != nil {
		return f.Error
	}
	if result != nil {
		return msgpack.Unmarshal(f.Result, result)
	}
	return nil
}

// bigBytes is the size of the file a slow reader reads again and again.
const bigBytes = 1 << 20

// slowReader makes an env, then until the run ends: sends pipelined
// read_file requests of a 1 MiB file, leaves their answers unread for a
// few seconds, then reads them all (or, sometimes, cuts the connection
// with them unread: an injected fault). It also sends a text frame and a
// duplicate msgid once per round.
func (r *run) slowReader(id int, rng *rand.Rand) {
	what := func(s string) string { return fmt.Sprintf("slow reader %d: %s", id, s) }
	for time.Now().Before(r.end) {
		if !r.slowRound(id, rng, what) {
			time.Sleep(time.Second) // the failure is recorded; do not spin
		}
	}
}

func (r *run) slowRound(id int, rng *rand.Rand, what func(string) string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.hang)
	c, err := dialRaw(ctx, r.s.addr, r.cfg.hang)
	cancel()
	if err != nil {
		r.rec.fail(what("dial: %v"), err)
		return false
	}
	defer c.ws.Close()
	var res arbor.ResetResult
	start := time.Now()
	if r.rec.check("reset", what("reset busybox"), start, nil, nil, c.call(1, protocol.MethodReset, arbor.ResetParams{Image: "busybox"}, &res)) != nil {
		return false
	}
	env := res.EnvID
	start = time.Now()
	mk := protocol.StepParams{EnvID: env, Action: arbor.Bash(fmt.Sprintf("mkdir -p /work && head -c %d /dev/zero > /work/big", bigBytes), 0)}
	if r.rec.check("step", what("make the big file"), start, nil, nil, c.call(2, protocol.MethodStep, mk, nil)) != nil {
		return false
	}

	// A frame that is not msgpack: an "error" notification, the
	// connection stays.
	c.ws.WriteMessage(websocket.TextMessage, []byte("not msgpack"))
	start = time.Now()
	for {
		f, err := c.read()
		if err != nil {
			r.rec.check("(text frame)", what("text frame"), start, nil, nil, err)
			return false
		}
		if f.Type == protocol.Notification && f.Method == "error" {
			var pe protocol.Error
			msgpack.Unmarshal(f.Params, &pe)
			r.rec.check("(text frame)", what("text frame"), start, nil, &expect{codes: []string{protocol.CodeMalformed}}, &pe)
			break
		}
	}

	// A msgid reused while its request is in flight is refused under
	// that id; the first request still gets its own answer.
	start = time.Now()
	c.send(3, protocol.MethodStep, protocol.StepParams{EnvID: env, Action: arbor.Bash("sleep 0.3", 0)})
	c.send(3, protocol.MethodStep, protocol.StepParams{EnvID: env, Action: arbor.Bash("true", 0)})
	var answers []*protocol.Error
	for len(answers) < 2 {
		f, err := c.response(3)
		if err != nil {
			r.rec.check("step (duplicate msgid)", what("duplicate msgid"), start, nil, nil, err)
			return false
		}
		answers = append(answers, f.Error)
	}
	refused := 0
	for _, a := range answers {
		var err error
		if a != nil {
			err = a
			refused++
		}
		r.rec.check("step (duplicate msgid)", what("duplicate msgid"), start, nil, &expect{codes: []string{protocol.CodeBadRequest}}, err)
	}
	if refused != 1 {
		r.rec.fail(what("two requests under msgid 3 in flight: %d of the 2 answers refused the duplicate, want 1"), refused)
	}

	// The slow part: answers of k requests left unread.
	k := 4 + rng.Intn(5)
	read := protocol.StepParams{EnvID: env, Action: arbor.Action{Tool: state.ToolReadFile, Path: "/work/big", MaxOutput: 2 * bigBytes}}
	start = time.Now()
	for i := 0; i < k; i++ {
		if err := c.send(uint32(100+i), protocol.MethodStep, read); err != nil {
			r.rec.check("step (unread)", what("send read_file"), start, nil, nil, err)
			return false
		}
	}
	time.Sleep(time.Duration(1000+rng.Intn(4000)) * time.Millisecond)
	if r.cfg.faults && rng.Intn(4) == 0 {
		// Cut with the answers unread: the env is closed at the end.
		r.rec.fault("slow reader cut with answers unread")
		if tc, ok := c.ws.UnderlyingConn().(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		for i := 0; i < k; i++ {
			r.rec.count("step (unread)", codeDropped, 0)
		}
		return true
	}
	for got := 0; got < k; got++ {
		f, err := c.read()
		if err != nil {
			r.rec.check("step (unread)", what("read the held answers"), start, nil, nil, err)
			return false
		}
		if f.Type != protocol.Response {
			got--
			continue
		}
		var err2 error
		var sr arbor.StepResult
		if f.Error != nil {
			err2 = f.Error
		} else if err := msgpack.Unmarshal(f.Result, &sr); err != nil {
			err2 = fmt.Errorf("decode: %w", err)
		}
		if r.rec.check("step (unread)", what("read_file held unread"), start, nil, nil, err2) == nil && len(sr.Obs.Stdout) != bigBytes {
			r.rec.fail(what("read_file of a %d-byte file held unread: %d bytes (truncated %v)"), bigBytes, len(sr.Obs.Stdout), sr.Obs.Truncated)
		}
	}
	r.rec.note("slow reader's held answers all arrived")
	start = time.Now()
	r.rec.check("close", what("close "+env), start, nil, nil, c.call(4, protocol.MethodClose, protocol.EnvParams{EnvID: env}, nil))
	return true
}
