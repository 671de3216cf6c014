package protocol

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeFrame(t *testing.T) {
	deep := bytes.Repeat([]byte{0x91}, MaxDepth+2)
	deep = append(deep, 0xc0)
	tests := []struct {
		name    string
		in      []byte
		wantErr bool
		check   func(t *testing.T, f Frame)
	}{
		{name: "request", in: mustMarshal(t, []any{0, 7, "step", []any{map[string]any{"env_id": "e1"}}}),
			check: func(t *testing.T, f Frame) {
				if f.Type != Request || f.MsgID != 7 || f.Method != "step" || f.Params == nil {
					t.Errorf("got %+v", f)
				}
			}},
		{name: "request without params", in: mustMarshal(t, []any{0, 1, "envs", []any{}}),
			check: func(t *testing.T, f Frame) {
				if f.Params != nil {
					t.Errorf("params %v", f.Params)
				}
			}},
		{name: "request nil params", in: mustMarshal(t, []any{0, 1, "envs", []any{nil}})},
		{name: "notification", in: mustMarshal(t, []any{2, "step_batch", []any{map[string]any{"index": 1}}}),
			check: func(t *testing.T, f Frame) {
				if f.Type != Notification || f.Method != "step_batch" {
					t.Errorf("got %+v", f)
				}
			}},
		{name: "response error", in: mustMarshal(t, []any{1, 3, map[string]any{"code": "unknown_env", "message": "x"}, nil}),
			check: func(t *testing.T, f Frame) {
				if f.Error == nil || f.Error.Code != CodeUnknownEnv || !errors.Is(f.Error, ErrUnknownEnv) {
					t.Errorf("got %+v", f.Error)
				}
			}},
		{name: "response result", in: mustMarshal(t, []any{1, 3, nil, map[string]any{"env_id": "e"}}),
			check: func(t *testing.T, f Frame) {
				var r ResetResult
				if err := msgpack.Unmarshal(f.Result, &r); err != nil || r.EnvID != "e" {
					t.Errorf("result %v %v", r, err)
				}
			}},
		{name: "empty", in: nil, wantErr: true},
		{name: "not an array", in: mustMarshal(t, "hello"), wantErr: true},
		{name: "short array", in: mustMarshal(t, []any{0, 1}), wantErr: true},
		{name: "bad type", in: mustMarshal(t, []any{5, 1, "x", []any{}}), wantErr: true},
		{name: "negative msgid", in: mustMarshal(t, []any{0, -1, "x", []any{}}), wantErr: true},
		{name: "huge msgid", in: mustMarshal(t, []any{0, int64(1) << 40, "x", []any{}}), wantErr: true},
		{name: "method not a string", in: mustMarshal(t, []any{0, 1, 2, []any{}}), wantErr: true},
		{name: "params not an array", in: mustMarshal(t, []any{0, 1, "x", map[string]any{}}), wantErr: true},
		{name: "params not a map", in: mustMarshal(t, []any{0, 1, "x", []any{1}}), wantErr: true},
		{name: "two params", in: mustMarshal(t, []any{0, 1, "x", []any{map[string]any{}, map[string]any{}}}), wantErr: true},
		{name: "trailing bytes", in: append(mustMarshal(t, []any{0, 1, "x", []any{}}), 0xc0), wantErr: true},
		{name: "truncated", in: mustMarshal(t, []any{0, 1, "envs", []any{}})[:5], wantErr: true},
		{name: "too deep", in: deep, wantErr: true},
		{name: "huge declared map", in: []byte{0x94, 0x00, 0x01, 0xa1, 'x', 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff}, wantErr: true},
		{name: "ext type", in: []byte{0x94, 0x00, 0x01, 0xa1, 'x', 0x91, 0xd4, 0x01, 0x00}, wantErr: true},
		{name: "never used byte", in: []byte{0xc1}, wantErr: true},
		{name: "integer map key", in: mustMarshal(t, []any{0, 1, "x", []any{map[int]any{1: "a"}}}), wantErr: true},
		{name: "nested integer map key", in: mustMarshal(t, []any{0, 1, "step", []any{map[string]any{"action": map[int]any{1: "a"}}}}), wantErr: true},
		{name: "bin map key", in: append([]byte{0x94, 0x00, 0x01, 0xa1, 'x', 0x91, 0x81, 0xc4, 0x06}, "env_id\xa1e"...),
			check: func(t *testing.T, f Frame) {
				var p EnvParams
				if err := DecodeParams(f.Params, &p); err != nil || p.EnvID != "e" {
					t.Errorf("params with a bin key: %+v, %v", p, err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := DecodeFrame(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrFrame) {
				t.Errorf("error %v does not wrap ErrFrame", err)
			}
			if err == nil && tt.check != nil {
				tt.check(t, f)
			}
		})
	}
}

func TestPeekRequest(t *testing.T) {
	b, _ := EncodeRequest(42, "step", map[string]any{"content": bytes.Repeat([]byte("x"), 1000)})
	id, m, ok := PeekRequest(b[:30])
	if !ok || id != 42 || m != "step" {
		t.Fatalf("PeekRequest = %d %q %v", id, m, ok)
	}
	if _, _, ok := PeekRequest([]byte{0x93}); ok {
		t.Fatal("PeekRequest accepted a non-request")
	}
}

func TestRoundTrip(t *testing.T) {
	b, err := EncodeResponse(9, nil, StepResult{Obs: Obs{Stdout: "hi", Stderr: Text([]byte{0xff, 0x00})}, Reward: 1})
	if err != nil {
		t.Fatal(err)
	}
	f, err := DecodeFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	var r StepResult
	if err := msgpack.Unmarshal(f.Result, &r); err != nil {
		t.Fatal(err)
	}
	if r.Obs.Stdout != "hi" || r.Obs.Stderr != "\xff\x00" || r.Reward != 1 {
		t.Fatalf("round trip: %+v", r)
	}
	// Binary output travels as bin, text as str.
	var m map[string]any
	msgpack.Unmarshal(mustMarshal(t, r.Obs), &m)
	if _, ok := m["stdout"].(string); !ok {
		t.Errorf("stdout is %T, want string", m["stdout"])
	}
	if _, ok := m["stderr"].([]byte); !ok {
		t.Errorf("stderr is %T, want []byte", m["stderr"])
	}
	e, _ := EncodeResponse(1, Errorf(CodeTimeout, "slow"), "ignored")
	f, _ = DecodeFrame(e)
	if f.Error == nil || !f.Error.Infra || !f.Error.Retryable || !IsInfra(f.Error) {
		t.Fatalf("error frame: %+v", f.Error)
	}
}

// FuzzDecodeFrame feeds arbitrary bytes to the decoder: it must never
// panic, and whatever it accepts must re-decode its params as a map.
func FuzzDecodeFrame(f *testing.F) {
	seeds := [][]byte{
		nil, {0xc1}, {0x90}, {0x94, 0x00, 0x01, 0xa1, 'x', 0x90},
		{0x94, 0x00, 0x01, 0xa1, 'x', 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff},
		bytes.Repeat([]byte{0x91}, 100),
	}
	for _, v := range []any{
		[]any{0, 1, "hello", []any{map[string]any{"token": "t"}}},
		[]any{0, 2, "step", []any{map[string]any{"env_id": "e", "action": map[string]any{"tool": "bash", "cmd": "ls", "timeout_s": 1.5}}}},
		[]any{0, 3, "step", []any{map[string]any{"env_id": "e", "action": map[string]any{"tool": "write_file", "path": "a b", "content": []byte{0, 1, 2}}}}},
		[]any{0, 4, "branch", []any{map[string]any{"state_id": "s1", "n": 4}}},
		[]any{0, 5, "step_batch", []any{map[string]any{"items": []any{map[string]any{"env_id": "e", "action": map[string]any{"tool": "bash"}}}}}},
		[]any{1, 5, nil, map[string]any{"env_id": "e"}},
		[]any{1, 6, map[string]any{"code": "x", "message": "m", "retryable": true}, nil},
		[]any{2, "step_batch", []any{map[string]any{"index": 0}}},
		[]any{0, 7, "envs", []any{}},
	} {
		seeds = append(seeds, mustMarshal(f, v))
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := DecodeFrame(b)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("error %v does not wrap ErrFrame", err)
			}
			return
		}
		if fr.Params != nil {
			var m map[string]any
			if err := msgpack.Unmarshal(fr.Params, &m); err != nil {
				t.Fatalf("accepted params do not decode as a map: %v", err)
			}
		}
		PeekRequest(b)
	})
}
