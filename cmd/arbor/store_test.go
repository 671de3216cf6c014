package main

import "testing"

func TestParseSize(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int64
		wantErr bool
	}{
		{"bytes", "4096", 4096, false},
		{"gigabytes", "20G", 20 << 30, false},
		{"gib", "20GiB", 20 << 30, false},
		{"lower", "512m", 512 << 20, false},
		{"fraction", "1.5K", 1536, false},
		{"garbage", "lots", 0, true},
		{"negative", "-1G", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSize(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parseSize(%q) = %d, %v; want %d, err=%v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}
