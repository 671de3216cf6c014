package protocol

import (
	"errors"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestTrajectoryParams(t *testing.T) {
	tests := []struct {
		name    string
		in      any
		want    TrajectoryParams
		wantErr string
	}{
		{name: "env", in: m{"env_id": "e"}, want: TrajectoryParams{EnvID: "e"}},
		{name: "state bin", in: m{"state_id": []byte("s")}, want: TrajectoryParams{StateID: "s"}},
		{name: "both", in: m{"env_id": "e", "state_id": "s"}, wantErr: "trajectory needs exactly one of env_id and state_id"},
		{name: "neither", in: m{}, wantErr: "trajectory needs exactly one of env_id and state_id"},
		{name: "no params", in: nil, wantErr: "trajectory needs exactly one of env_id and state_id"},
		{name: "wrong type", in: m{"state_id": 5}, wantErr: "state_id: want string, got integer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var raw msgpack.RawMessage
			if tt.in != nil {
				raw = sorted(t, tt.in)
			}
			var got TrajectoryParams
			err := DecodeParams(raw, &got)
			if tt.wantErr != "" {
				var e *Error
				if !errors.As(err, &e) || e.Code != CodeInvalidParams || e.Message != tt.wantErr {
					t.Fatalf("error %v, want invalid_params: %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("decoded %+v (%v), want %+v", got, err, tt.want)
			}
		})
	}
	for _, p := range []*TrajectoryParams{{EnvID: "e"}, {StateID: "s"}} {
		var got TrajectoryParams
		if err := DecodeParams(mustMarshal(t, p), &got); err != nil || !reflect.DeepEqual(&got, p) {
			t.Errorf("round trip of %+v: %+v, %v", p, got, err)
		}
	}
}
