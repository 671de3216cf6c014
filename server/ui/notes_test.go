package ui

import "testing"

// TestCut: the turn log keeps a head on a rune boundary, from strings and
// byte slices alike, and keeps the head of output that is not UTF-8.
func TestCut(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
		cut  bool
	}{
		{"short", 10, "short", false},
		{"abcdef", 4, "abcd", true},
		{"ab\u00e9cd", 3, "ab", true},             // é is 2 bytes: not split
		{"ab\u00e9cd", 4, "ab\u00e9", true},       // whole
		{"a\u20acb", 3, "a", true},                // € is 3 bytes
		{"\xff\xfebinary", 4, "\xff\xfebi", true}, // not dropped for being invalid
	} {
		got, c := cut(tc.in, tc.max)
		gotB, cB := cut([]byte(tc.in), tc.max)
		if got != tc.want || c != tc.cut || gotB != got || cB != c {
			t.Errorf("cut(%q, %d) = %q %v (bytes: %q %v), want %q %v", tc.in, tc.max, got, c, gotB, cB, tc.want, tc.cut)
		}
	}
}
