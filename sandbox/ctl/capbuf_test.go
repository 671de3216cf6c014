package ctl

import (
	"bytes"
	"strings"
	"testing"
)

func TestCapBuffer(t *testing.T) {
	tests := []struct {
		name      string
		limit     int
		writes    []string
		want      string
		truncated bool
	}{
		{name: "fits", limit: 10, writes: []string{"abc", "def"}, want: "abcdef"},
		{name: "exactly full", limit: 6, writes: []string{"abcdef"}, want: "abcdef"},
		{name: "one big write", limit: 6, writes: []string{"0123456789"}, want: "012\n[... arbor: 4 bytes omitted ...]\n789", truncated: true},
		{name: "many small writes wrap the tail", limit: 6, writes: []string{"01", "23", "45", "67", "89"}, want: "012\n[... arbor: 4 bytes omitted ...]\n789", truncated: true},
		{name: "bytewise", limit: 4, writes: strings.Split("abcdefghij", ""), want: "ab\n[... arbor: 6 bytes omitted ...]\nij", truncated: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewCapBuffer(tt.limit)
			var total int
			for _, w := range tt.writes {
				b.Write([]byte(w))
				total += len(w)
			}
			if got := string(b.Bytes()); got != tt.want {
				t.Errorf("Bytes() = %q, want %q", got, tt.want)
			}
			if b.Truncated() != tt.truncated {
				t.Errorf("Truncated() = %v, want %v", b.Truncated(), tt.truncated)
			}
			if b.Total() != int64(total) {
				t.Errorf("Total() = %d, want %d", b.Total(), total)
			}
		})
	}
}

func FuzzCapBuffer(f *testing.F) {
	f.Add([]byte("hello world, this is a test"), 7, 3)
	f.Fuzz(func(t *testing.T, data []byte, limit, chunk int) {
		if limit < 2 || limit > 1<<12 || chunk < 1 {
			return
		}
		b := NewCapBuffer(limit)
		for i := 0; i < len(data); i += chunk {
			b.Write(data[i:min(i+chunk, len(data))])
		}
		got := b.Bytes()
		if !b.Truncated() {
			if !bytes.Equal(got, data) {
				t.Fatalf("untruncated mismatch: %q vs %q", got, data)
			}
			return
		}
		head, tail := limit/2, limit-limit/2
		if !bytes.HasPrefix(got, data[:head]) || !bytes.HasSuffix(got, data[len(data)-tail:]) {
			t.Fatalf("head/tail lost: %q from %q", got, data)
		}
	})
}
