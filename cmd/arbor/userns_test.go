package main

import (
	"testing"

	"github.com/arbor-env/arbor/sandbox"
)

func TestUserNSFlags(t *testing.T) {
	tests := []struct {
		name    string
		f       userNSFlags
		want    sandbox.UserNSConfig
		wantErr bool
	}{
		{"off", userNSFlags{on: false, rng: "garbage"}, sandbox.UserNSConfig{}, false},
		{"default range", userNSFlags{on: true, rng: "1073741824:65536"}, sandbox.UserNSConfig{Enabled: true, HostID: 1 << 30, Size: 65536}, false},
		{"other range", userNSFlags{on: true, rng: "200000:1000"}, sandbox.UserNSConfig{Enabled: true, HostID: 200000, Size: 1000}, false},
		{"no size", userNSFlags{on: true, rng: "200000"}, sandbox.UserNSConfig{}, true},
		{"host root", userNSFlags{on: true, rng: "0:65536"}, sandbox.UserNSConfig{}, true},
		{"empty", userNSFlags{on: true, rng: "1:0"}, sandbox.UserNSConfig{}, true},
		{"past 32 bits", userNSFlags{on: true, rng: "4294967000:65536"}, sandbox.UserNSConfig{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.f.config()
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("got %+v, %v; want %+v, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
