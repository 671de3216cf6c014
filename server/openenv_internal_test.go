package server

import (
	"encoding/json"
	"testing"
)

func TestOEReward(t *testing.T) {
	for _, tt := range []struct {
		name string
		r    oeReward
		want string
	}{
		{"one", 1, "1.0"},
		{"zero", 0, "0.0"},
		{"fraction", 0.25, "0.25"},
		{"negative", -2, "-2.0"},
		{"exponent", 1e21, "1e+21"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.r)
			if err != nil || string(b) != tt.want {
				t.Errorf("%v: %s %v, want %s", float64(tt.r), b, err, tt.want)
			}
			var back float64
			if err := json.Unmarshal(b, &back); err != nil || back != float64(tt.r) {
				t.Errorf("%s reads back as %v %v", b, back, err)
			}
		})
	}
}

// JSON numbers become msgpack's integers where they are integral, so
// that v1's integer fields take them.
func TestFromJSON(t *testing.T) {
	f, err := oeFields(json.RawMessage(`{"n": 3, "x": 1.5, "big": 12345678901234, "l": [1, {"k": 2.0}]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	got := fromJSON(f).(map[string]any)
	if got["n"] != int64(3) || got["x"] != 1.5 || got["big"] != int64(12345678901234) {
		t.Errorf("fromJSON: %#v", got)
	}
	l := got["l"].([]any)
	if l[0] != int64(1) || l[1].(map[string]any)["k"] != 2.0 {
		t.Errorf("fromJSON nested: %#v", l)
	}
	for _, bad := range []string{`[1]`, `"s"`, `3`} {
		if _, err := oeFields(json.RawMessage(bad), ""); err == nil {
			t.Errorf("oeFields(%s): no error", bad)
		}
	}
	if _, err := oeFields(json.RawMessage(`null`), "the action"); err == nil {
		t.Errorf("oeFields(null) of a required object: no error")
	}
}
