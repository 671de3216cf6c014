package main

import "testing"

func TestParseDisk(t *testing.T) {
	tests := []struct {
		name, in string
		want     int64
		wantErr  bool
	}{
		{"empty is the default", "", 0, false},
		{"size", "512M", 512 << 20, false},
		{"gibibytes", "2GiB", 2 << 30, false},
		{"none", "none", -1, false},
		{"negative", "-1", -1, false},
		{"zero refused", "0", 0, true},
		{"garbage", "lots", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDisk(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parseDisk(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}
