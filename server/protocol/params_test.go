package protocol

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/state"
)

func i64(n int64) *int64 { return &n }

// sorted encodes v with map keys in order, so that messages naming
// several fields (in the order the fields came) are the same every run.
func sorted(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.SetSortMapKeys(true)
	if err := e.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// m is a params map as a client sends it.
type m = map[string]any

func TestDecodeParams(t *testing.T) {
	bash := m{"tool": "bash", "cmd": "ls"}
	tests := []struct {
		name string
		in   any // marshalled with msgpack; nil is no params at all
		into Params
		want Params // decoded, when wantErr is ""
		// wantErr is the whole message of the invalid_params error.
		wantErr string
	}{
		// hello
		{name: "hello", in: m{"token": "t"}, into: &HelloParams{}, want: &HelloParams{Token: "t"}},
		{name: "hello no params", in: nil, into: &HelloParams{}, want: &HelloParams{}},
		{name: "hello token bin", in: m{"token": []byte("t")}, into: &HelloParams{}, want: &HelloParams{Token: "t"}},
		{name: "hello token int", in: m{"token": 5}, into: &HelloParams{}, wantErr: "token: want string, got integer"},
		{name: "hello unknown field", in: m{"token": "t", "later": m{"x": []any{1}}}, into: &HelloParams{}, want: &HelloParams{Token: "t"}},

		// reset
		{name: "reset image", in: m{"image": "busybox"}, into: &ResetParams{}, want: &ResetParams{Image: "busybox"}},
		{name: "reset task bin", in: m{"task": []byte("count")}, into: &ResetParams{}, want: &ResetParams{Task: "count"}},
		{name: "reset seed int8", in: m{"task": "t", "seed": int8(-3)}, into: &ResetParams{}, want: &ResetParams{Task: "t", Seed: i64(-3)}},
		{name: "reset seed uint64", in: m{"task": "t", "seed": uint64(1 << 40)}, into: &ResetParams{}, want: &ResetParams{Task: "t", Seed: i64(1 << 40)}},
		{name: "reset seed int64", in: m{"task": "t", "seed": int64(math.MinInt64)}, into: &ResetParams{}, want: &ResetParams{Task: "t", Seed: i64(math.MinInt64)}},
		{name: "reset seed zero", in: m{"task": "t", "seed": 0}, into: &ResetParams{}, want: &ResetParams{Task: "t", Seed: i64(0)}},
		{name: "reset seed integral float", in: m{"task": "t", "seed": 7.0}, into: &ResetParams{}, want: &ResetParams{Task: "t", Seed: i64(7)}},
		{name: "reset seed float32", in: m{"task": "t", "seed": float32(2)}, into: &ResetParams{}, want: &ResetParams{Task: "t", Seed: i64(2)}},
		{name: "reset seed nil", in: m{"task": "t", "seed": nil}, into: &ResetParams{}, want: &ResetParams{Task: "t"}},
		{name: "reset seed fraction", in: m{"task": "t", "seed": 3.5}, into: &ResetParams{}, wantErr: "seed: want integer, got float 3.5"},
		{name: "reset seed huge float", in: m{"task": "t", "seed": 1e300}, into: &ResetParams{}, wantErr: "seed: want integer, got float 1e+300"},
		{name: "reset seed over int64", in: m{"task": "t", "seed": uint64(math.MaxUint64)}, into: &ResetParams{}, wantErr: "seed: integer out of range"},
		{name: "reset seed string", in: m{"task": "t", "seed": "7"}, into: &ResetParams{}, wantErr: "seed: want integer, got string"},
		{name: "reset options", in: m{"image": "i", "options": m{"gpu": true}}, into: &ResetParams{},
			want: &ResetParams{Image: "i", Options: map[string]any{"gpu": true}}},
		{name: "reset options not a map", in: m{"image": "i", "options": "x"}, into: &ResetParams{}, wantErr: "options: want map, got string"},
		{name: "reset neither", in: m{}, into: &ResetParams{}, wantErr: "reset needs image, task or dataset"},
		{name: "reset image wrong type", in: m{"image": true}, into: &ResetParams{}, wantErr: "image: want string, got bool"},

		// step
		{name: "step bash", in: m{"env_id": "e", "action": m{"tool": "bash", "cmd": "ls", "timeout_s": 1.5, "max_output": 10}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolBash, Cmd: "ls", TimeoutS: 1.5, MaxOutput: 10}}},
		{name: "step timeout int", in: m{"env_id": "e", "action": m{"tool": "bash", "cmd": "ls", "timeout_s": uint16(300)}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolBash, Cmd: "ls", TimeoutS: 300}}},
		{name: "step max_output float", in: m{"env_id": "e", "action": m{"tool": "bash", "cmd": "ls", "max_output": 4096.0}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolBash, Cmd: "ls", MaxOutput: 4096}}},
		{name: "step bin strings", in: m{"env_id": []byte("e"), "action": m{"tool": []byte("bash"), "cmd": []byte("ls")}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolBash, Cmd: "ls"}}},
		{name: "step unknown fields", in: m{"env_id": "e", "trace": "x", "action": m{"tool": "bash", "cmd": "ls", "nice": 5}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolBash, Cmd: "ls"}}},
		{name: "step write_file str", in: m{"env_id": "e", "action": m{"tool": "write_file", "path": "a b", "content": "hi"}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolWriteFile, Path: "a b", Content: []byte("hi")}}},
		{name: "step write_file bin", in: m{"env_id": "e", "action": m{"tool": "write_file", "path": "p", "content": []byte{0, 0xff}}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolWriteFile, Path: "p", Content: []byte{0, 0xff}}}},
		{name: "step write_file no content", in: m{"env_id": "e", "action": m{"tool": "write_file", "path": "p"}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolWriteFile, Path: "p"}}},
		{name: "step read_file", in: m{"env_id": "e", "action": m{"tool": "read_file", "path": "p"}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolReadFile, Path: "p"}}},
		{name: "step rollback", in: m{"env_id": "e", "action": m{"tool": "rollback", "state_id": "s1"}}, into: &StepParams{},
			want: &StepParams{EnvID: "e", Action: Action{Tool: state.ToolRollback, StateID: "s1"}}},
		{name: "step nothing", in: m{}, into: &StepParams{}, wantErr: "env_id: required string is missing; action.tool: required string is missing"},
		{name: "step no params", in: nil, into: &StepParams{}, wantErr: "env_id: required string is missing; action.tool: required string is missing"},
		{name: "step action not a map", in: m{"env_id": "e", "action": "ls"}, into: &StepParams{}, wantErr: "action: want map, got string"},
		{name: "step env_id array", in: m{"env_id": []any{"e"}, "action": bash}, into: &StepParams{}, wantErr: "env_id: want string, got array"},
		{name: "step cmd int", in: m{"env_id": "e", "action": m{"tool": "bash", "cmd": 5}}, into: &StepParams{}, wantErr: "action.cmd: want string, got integer"},
		{name: "step bash without cmd", in: m{"env_id": "e", "action": m{"tool": "bash"}}, into: &StepParams{}, wantErr: "action.cmd: required string is missing"},
		{name: "step timeout negative", in: m{"env_id": "e", "action": m{"tool": "bash", "cmd": "ls", "timeout_s": -1}}, into: &StepParams{},
			wantErr: "action.timeout_s: must not be negative"},
		{name: "step timeout NaN", in: m{"env_id": "e", "action": m{"tool": "bash", "cmd": "ls", "timeout_s": math.NaN()}}, into: &StepParams{},
			wantErr: "action.timeout_s: want a finite number"},
		{name: "step timeout string", in: m{"env_id": "e", "action": m{"tool": "bash", "cmd": "ls", "timeout_s": "1"}}, into: &StepParams{},
			wantErr: "action.timeout_s: want number, got string"},
		{name: "step unknown tool", in: m{"env_id": "e", "action": m{"tool": "rm"}}, into: &StepParams{},
			wantErr: `action.tool: unknown tool "rm" (want one of bash, write_file, read_file, rollback)`},
		{name: "step tool int", in: m{"env_id": "e", "action": m{"tool": 1}}, into: &StepParams{}, wantErr: "action.tool: want string, got integer"},
		{name: "step content int", in: m{"env_id": "e", "action": m{"tool": "write_file", "path": "p", "content": 1}}, into: &StepParams{},
			wantErr: "action.content: want binary or string, got integer"},
		{name: "step empty path", in: m{"env_id": "e", "action": m{"tool": "read_file", "path": ""}}, into: &StepParams{},
			wantErr: "action.path: required string is missing"},
		{name: "step write_file without path", in: m{"env_id": "e", "action": m{"tool": "write_file", "content": "x"}}, into: &StepParams{},
			wantErr: "action.path: required string is missing"},
		{name: "step rollback without state", in: m{"env_id": "e", "action": m{"tool": "rollback"}}, into: &StepParams{},
			wantErr: "action.state_id: required string is missing"},
		{name: "step max_output negative", in: m{"env_id": "e", "action": m{"tool": "bash", "cmd": "ls", "max_output": -1}}, into: &StepParams{},
			wantErr: "action.max_output: must not be negative"},
		{name: "step max_output fraction", in: m{"env_id": "e", "action": m{"tool": "bash", "cmd": "ls", "max_output": 1.5}}, into: &StepParams{},
			wantErr: "action.max_output: want integer, got float 1.5"},
		{name: "step every problem", in: m{"env_id": 1, "action": m{"tool": "bash", "cmd": false, "timeout_s": -2, "max_output": "x"}}, into: &StepParams{},
			wantErr: "action.cmd: want string, got bool; action.max_output: want integer, got string; env_id: want string, got integer; action.timeout_s: must not be negative"},

		// branch
		{name: "branch state", in: m{"state_id": "s", "n": 4}, into: &BranchParams{}, want: &BranchParams{StateID: "s", N: 4}},
		{name: "branch env float n", in: m{"env_id": "e", "n": 2.0}, into: &BranchParams{}, want: &BranchParams{EnvID: "e", N: 2}},
		{name: "branch both", in: m{"env_id": "e", "state_id": "s", "n": 1}, into: &BranchParams{}, wantErr: "branch needs exactly one of env_id and state_id"},
		{name: "branch neither", in: m{"n": 1}, into: &BranchParams{}, wantErr: "branch needs exactly one of env_id and state_id"},
		{name: "branch n zero", in: m{"state_id": "s", "n": 0}, into: &BranchParams{}, wantErr: "n: want at least 1, got 0"},
		{name: "branch n missing", in: m{"state_id": "s"}, into: &BranchParams{}, wantErr: "n: want at least 1, got 0"},
		{name: "branch wrong types", in: m{"state_id": 5, "n": "four"}, into: &BranchParams{},
			wantErr: "n: want integer, got string; state_id: want string, got integer"},

		// the methods on one env
		{name: "env", in: m{"env_id": "e"}, into: &EnvParams{}, want: &EnvParams{EnvID: "e"}},
		{name: "env bin", in: m{"env_id": []byte("e")}, into: &CheckpointParams{}, want: &CheckpointParams{EnvID: "e"}},
		{name: "env missing", in: m{}, into: &CloseParams{}, wantErr: "env_id: required string is missing"},
		{name: "env nil", in: m{"env_id": nil}, into: &StatesParams{}, wantErr: "env_id: required string is missing"},
		{name: "env map", in: m{"env_id": m{}}, into: &PromoteParams{}, wantErr: "env_id: want string, got map"},

		// rollback
		{name: "rollback", in: m{"env_id": "e", "state_id": "s"}, into: &RollbackParams{}, want: &RollbackParams{EnvID: "e", StateID: "s"}},
		{name: "rollback missing", in: m{}, into: &RollbackParams{}, wantErr: "env_id: required string is missing; state_id: required string is missing"},
		{name: "rollback state float", in: m{"env_id": "e", "state_id": 1.5}, into: &RollbackParams{}, wantErr: "state_id: want string, got float"},

		// release, pin, unpin
		{name: "release", in: m{"state_ids": []any{"s1", []byte("s2")}}, into: &ReleaseParams{}, want: &ReleaseParams{StateIDs: []string{"s1", "s2"}}},
		{name: "pin missing", in: m{}, into: &PinParams{}, wantErr: "state_ids: want at least one state id"},
		{name: "unpin empty", in: m{"state_ids": []any{}}, into: &UnpinParams{}, wantErr: "state_ids: want at least one state id"},
		{name: "pin empty id", in: m{"state_ids": []any{"s1", ""}}, into: &PinParams{}, wantErr: "state_ids[1]: required string is missing"},
		{name: "release not an array", in: m{"state_ids": "s1"}, into: &ReleaseParams{}, wantErr: "state_ids: want array, got string"},
		{name: "release id int", in: m{"state_ids": []any{7}}, into: &ReleaseParams{}, wantErr: "state_ids[0]: want string, got integer"},

		// prepare
		{name: "prepare", in: m{"state_ids": []any{"s1", "s2"}, "n": 8, "wait": true}, into: &PrepareParams{},
			want: &PrepareParams{StateIDs: []string{"s1", "s2"}, N: 8, Wait: true}},
		{name: "prepare no wait", in: m{"state_ids": []any{"s1"}, "n": 1}, into: &PrepareParams{}, want: &PrepareParams{StateIDs: []string{"s1"}, N: 1}},
		{name: "prepare wait nil", in: m{"state_ids": []any{"s1"}, "n": 1, "wait": nil}, into: &PrepareParams{}, want: &PrepareParams{StateIDs: []string{"s1"}, N: 1}},
		{name: "prepare empty", in: m{"state_ids": []any{}, "n": 1}, into: &PrepareParams{}, wantErr: "state_ids: want at least one state id"},
		{name: "prepare n missing", in: m{"state_ids": []any{"s1"}}, into: &PrepareParams{}, wantErr: "n: want 1 to 64, got 0"},
		{name: "prepare n over", in: m{"state_ids": []any{"s1"}, "n": 65}, into: &PrepareParams{}, wantErr: "n: want 1 to 64, got 65"},
		{name: "prepare n string", in: m{"state_ids": []any{"s1"}, "n": "2"}, into: &PrepareParams{}, wantErr: "n: want integer, got string"},
		{name: "prepare wait int", in: m{"state_ids": []any{"s1"}, "n": 1, "wait": 1}, into: &PrepareParams{}, wantErr: "wait: want bool, got integer"},

		// envs
		{name: "envs", in: m{"filter": "x"}, into: &EnvsParams{}, want: &EnvsParams{}},
		{name: "envs no params", in: nil, into: &EnvsParams{}, want: &EnvsParams{}},

		// step_batch
		{name: "batch", in: m{"items": []any{m{"env_id": "a", "action": bash}, m{"env_id": []byte("b"), "action": m{"tool": "read_file", "path": "p"}}}},
			into: &StepBatchParams{}, want: &StepBatchParams{Items: []BatchItem{{EnvID: "a", Action: Action{Tool: state.ToolBash, Cmd: "ls"}},
				{EnvID: "b", Action: Action{Tool: state.ToolReadFile, Path: "p"}}}}},
		{name: "batch empty", in: m{"items": []any{}}, into: &StepBatchParams{}, want: &StepBatchParams{Items: []BatchItem{}}},
		{name: "batch missing", in: m{}, into: &StepBatchParams{}, wantErr: "items: required array is missing"},
		{name: "batch not an array", in: m{"items": "x"}, into: &StepBatchParams{}, wantErr: "items: want array, got string"},
		{name: "batch item not a map", in: m{"items": []any{1, m{"env_id": "a", "action": bash}}}, into: &StepBatchParams{},
			wantErr: "items[0]: want map, got integer"},
		{name: "batch item env int", in: m{"items": []any{m{"env_id": 1}}}, into: &StepBatchParams{},
			wantErr: "items[0].env_id: want string, got integer; items[0].action.tool: required string is missing"},
		{name: "batch second item", in: m{"items": []any{m{"env_id": "a", "action": bash}, m{"env_id": "b", "action": m{"tool": "bash"}}}},
			into: &StepBatchParams{}, wantErr: "items[1].action.cmd: required string is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var raw msgpack.RawMessage
			if tt.in != nil {
				raw = sorted(t, tt.in)
			}
			err := DecodeParams(raw, tt.into)
			if tt.wantErr != "" {
				var e *Error
				if !errors.As(err, &e) || e.Code != CodeInvalidParams || e.Message != tt.wantErr {
					t.Fatalf("error %v, want invalid_params: %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(tt.into, tt.want) {
				t.Errorf("decoded %+v, want %+v", tt.into, tt.want)
			}
			if err := tt.into.Validate(); err != nil {
				t.Errorf("Validate of decoded params: %v", err)
			}
		})
	}
}

// TestParamsRoundTrip: what the Go client encodes the server decodes to
// the same value, so both sides have one definition of each request.
func TestParamsRoundTrip(t *testing.T) {
	for _, p := range []Params{
		&HelloParams{Token: "sesame"},
		&ResetParams{Task: "count", Seed: i64(-9), Options: map[string]any{"k": "v"}},
		&ResetParams{Image: "busybox"},
		&StepParams{EnvID: "e", Action: Action{Tool: state.ToolBash, Cmd: "echo hi", TimeoutS: 2.5, MaxOutput: 100}},
		&StepParams{EnvID: "e", Action: Action{Tool: state.ToolWriteFile, Path: "p", Content: []byte{0, 1, 0xff}}},
		&StepParams{EnvID: "e", Action: Action{Tool: state.ToolRollback, StateID: "s"}},
		&BranchParams{EnvID: "e", N: 3},
		&BranchParams{StateID: "s", N: 1},
		&EnvParams{EnvID: "e"},
		&RollbackParams{EnvID: "e", StateID: "s"},
		&EnvsParams{},
		&StateIDsParams{StateIDs: []string{"s1", "s2"}},
		&StepBatchParams{Items: []BatchItem{{EnvID: "a", Action: Action{Tool: state.ToolReadFile, Path: "f"}}}},
	} {
		got := reflect.New(reflect.TypeOf(p).Elem()).Interface().(Params)
		if err := DecodeParams(mustMarshal(t, p), got); err != nil {
			t.Errorf("%T: %v", p, err)
			continue
		}
		if !reflect.DeepEqual(got, p) {
			t.Errorf("%T: sent %+v, decoded %+v", p, p, got)
		}
	}
}

func TestValidate(t *testing.T) {
	err := (&StepParams{EnvID: "e", Action: Action{Tool: state.ToolBash}}).Validate()
	if !errors.Is(err, ErrInvalidParams) || err.Error() != "invalid_params: action.cmd: required string is missing" {
		t.Errorf("Validate: %v", err)
	}
	if err := (&Action{Tool: state.ToolReadFile, Path: "p"}).Validate(); err != nil {
		t.Errorf("Validate of a good action: %v", err)
	}
}

// allParams is a zero value of every params type.
func allParams() []Params {
	return []Params{&HelloParams{}, &ResetParams{}, &StepParams{}, &BranchParams{}, &EnvParams{},
		&RollbackParams{}, &EnvsParams{}, &StepBatchParams{}, &StateIDsParams{}}
}

// FuzzDecodeParams decodes the params of arbitrary frames into every
// params type: never a panic, only nil or invalid_params, and what is
// accepted passes Validate and re-encodes to params that decode the same.
func FuzzDecodeParams(f *testing.F) {
	for _, v := range []any{
		m{"token": "t"},
		m{"task": "t", "seed": 3.0, "options": m{"a": []any{1}}},
		m{"env_id": "e", "action": m{"tool": "bash", "cmd": "ls", "timeout_s": 1.5, "max_output": uint64(10)}},
		m{"env_id": []byte("e"), "action": m{"tool": "write_file", "path": "p", "content": []byte{0}}},
		m{"state_id": "s", "n": 2, "env_id": nil},
		m{"items": []any{m{"env_id": "e", "action": m{"tool": "rollback", "state_id": "s"}}, 1}},
	} {
		b, err := EncodeRequest(1, "x", v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := DecodeFrame(b)
		if err != nil || fr.Type != Request {
			return
		}
		for _, p := range allParams() {
			err := DecodeParams(fr.Params, p)
			if err != nil {
				var e *Error
				if !errors.As(err, &e) || e.Code != CodeInvalidParams {
					t.Fatalf("%T: error %v is not invalid_params", p, err)
				}
				continue
			}
			if err := p.Validate(); err != nil {
				t.Fatalf("%T: decoded, then Validate: %v", p, err)
			}
			b1 := sorted(t, p)
			again := reflect.New(reflect.TypeOf(p).Elem()).Interface().(Params)
			if err := DecodeParams(b1, again); err != nil {
				t.Fatalf("%T: re-encoded %+v does not decode: %v", p, p, err)
			}
			if b2 := sorted(t, again); !bytes.Equal(b1, b2) {
				t.Fatalf("%T: %+v re-encoded as %x, then %x", p, p, b1, b2)
			}
		}
	})
}

// BenchmarkDecodeParams: a step's params decoded and validated, the work
// the server does per request (and per step_batch item).
func BenchmarkDecodeParams(b *testing.B) {
	raw := sorted(b, m{"env_id": "0123456789ab", "action": m{"tool": "bash", "cmd": "pytest -x tests/", "timeout_s": 30, "max_output": 65536}})
	b.ReportAllocs()
	for b.Loop() {
		var p StepParams
		if err := DecodeParams(raw, &p); err != nil {
			b.Fatal(err)
		}
	}
}
