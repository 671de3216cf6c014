package initd

import (
	"reflect"
	"strings"
	"testing"
)

func TestSplitRecords(t *testing.T) {
	n1 := strings.Repeat("a1", 16)
	n2 := strings.Repeat("0f", 16)
	tests := []struct {
		name     string
		in       string
		want     []record
		wantRest string
		wantJunk int
	}{
		{name: "one record", in: "\036" + n1 + " 3 0 /root\036",
			want: []record{{nonce: n1, seq: 3, code: 0, pwd: "/root"}}},
		{name: "two records back to back", in: "\036" + n1 + " 3 1 /a\036\036" + n2 + " 4 127 /b c\036",
			want: []record{{nonce: n1, seq: 3, code: 1, pwd: "/a"}, {nonce: n2, seq: 4, code: 127, pwd: "/b c"}}},
		{name: "unterminated tail is kept", in: "\036" + n1 + " 3 0 /ro", wantRest: n1 + " 3 0 /ro"},
		{name: "junk before a record is cut off by its leading separator", in: "garbage\036" + n1 + " 3 0 /\036",
			want: []record{{nonce: n1, seq: 3, code: 0, pwd: "/"}}, wantJunk: 1},
		{name: "old format without nonce", in: "3 0 /forged\036", wantJunk: 1},
		{name: "short nonce", in: "\036abcd 3 0 /\036", wantJunk: 1},
		{name: "nonce not hex", in: "\036" + strings.Repeat("zz", 16) + " 3 0 /\036", wantJunk: 1},
		{name: "seq zero", in: "\036" + n1 + " 0 0 /\036", wantJunk: 1},
		{name: "exit out of range", in: "\036" + n1 + " 3 256 /\036", wantJunk: 1},
		{name: "exit not a number", in: "\036" + n1 + " 3 x /\036", wantJunk: 1},
		{name: "missing pwd", in: "\036" + n1 + " 3 0\036", wantJunk: 1},
		{name: "empty pwd is a record", in: "\036" + n1 + " 3 0 \036", want: []record{{nonce: n1, seq: 3, code: 0, pwd: ""}}},
		{name: "pwd with spaces", in: "\036" + n1 + " 9 2 /a b  c\036", want: []record{{nonce: n1, seq: 9, code: 2, pwd: "/a b  c"}}},
		{name: "oversized tail is dropped", in: strings.Repeat("x", maxPending+1), wantJunk: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, rest, junk := splitRecords([]byte(tt.in))
			if !reflect.DeepEqual(recs, tt.want) {
				t.Errorf("records = %+v, want %+v", recs, tt.want)
			}
			if string(rest) != tt.wantRest {
				t.Errorf("rest = %q, want %q", rest, tt.wantRest)
			}
			if junk != tt.wantJunk {
				t.Errorf("junk = %d, want %d", junk, tt.wantJunk)
			}
		})
	}
}

func TestSplitRecordsAcrossReads(t *testing.T) {
	n := newNonce()
	full := "\036" + n + " 12 4 /work/dir\036"
	for cut := 0; cut <= len(full); cut++ {
		recs, rest, junk := splitRecords([]byte(full[:cut]))
		recs2, rest2, junk2 := splitRecords(append(rest, full[cut:]...))
		all := append(recs, recs2...)
		if len(all) != 1 || all[0] != (record{nonce: n, seq: 12, code: 4, pwd: "/work/dir"}) || len(rest2) != 0 || junk+junk2 != 0 {
			t.Fatalf("cut at %d: records %+v rest %q junk %d", cut, all, rest2, junk+junk2)
		}
	}
}

func TestExpectedTake(t *testing.T) {
	n1, n2 := newNonce(), newNonce()
	if n1 == n2 || len(n1) != nonceLen {
		t.Fatalf("nonces %q and %q", n1, n2)
	}
	tests := []struct {
		name string
		rec  record
		want bool
	}{
		{name: "right nonce and seq", rec: record{nonce: n1, seq: 5}, want: true},
		{name: "the same record again", rec: record{nonce: n1, seq: 5}, want: false},
		{name: "right seq, wrong nonce", rec: record{nonce: n1, seq: 6}, want: false},
		{name: "right nonce, wrong seq", rec: record{nonce: n2, seq: 5}, want: false},
		{name: "marker", rec: record{nonce: n2, seq: 6}, want: true},
		{name: "nobody waits", rec: record{nonce: n2, seq: 7}, want: false},
	}
	e := expected{5: n1, 6: n2}
	for _, tt := range tests {
		if got := e.take(tt.rec); got != tt.want {
			t.Errorf("%s: take = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestStatusCmd(t *testing.T) {
	got := statusCmd("00ff", 7, 199)
	want := `\command \printf '\036%s %s %s %s\036' 00ff 7 "$?" "$PWD" >&199`
	if got != want {
		t.Errorf("statusCmd = %s\nwant         %s", got, want)
	}
}
