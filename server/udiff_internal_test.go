package server

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestUnified: a golden diff, and on random texts (edits up to and past
// maxEdits) a diff that GNU patch applies to a to give b exactly.
func TestUnified(t *testing.T) {
	for _, tt := range []struct{ name, a, b, want string }{
		{"same", "x\n", "x\n", ""},
		{"one line", "a\nb\nc\n", "a\nB\nc\n", "--- a\n+++ b\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"},
		{"added to empty", "", "new\n", "--- a\n+++ b\n@@ -0,0 +1 @@\n+new\n"},
		{"no newline", "a\nb", "a\nb\n", "--- a\n+++ b\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"},
		{"two hunks", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "1\nX\n3\n4\n5\n6\n7\n8\n9\n10\nY\n12\n",
			"--- a\n+++ b\n@@ -1,5 +1,5 @@\n 1\n-2\n+X\n 3\n 4\n 5\n@@ -8,5 +8,5 @@\n 8\n 9\n 10\n-11\n+Y\n 12\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := unified("a", "b", tt.a, tt.b); got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
	patch, err := exec.LookPath("patch")
	if err != nil {
		t.Skip("GNU patch not installed")
	}
	r := rand.New(rand.NewPCG(1, 2))
	text := func(n int) []string {
		l := make([]string, n)
		for i := range l {
			l[i] = strconv.Itoa(r.IntN(8))
		}
		return l
	}
	dir := t.TempDir()
	for i := range 60 {
		a := text(r.IntN(60))
		b := append([]string(nil), a...)
		edits := r.IntN(12)
		if i%20 == 19 {
			a, b, edits = text(3000), text(3000), 0 // past maxEdits: replaced whole
		}
		for range edits {
			p := r.IntN(len(b) + 1)
			switch r.IntN(3) {
			case 0:
				b = append(b[:p], append([]string{"new" + strconv.Itoa(r.IntN(3))}, b[p:]...)...)
			case 1:
				if p < len(b) {
					b = append(b[:p], b[p+1:]...)
				}
			case 2:
				if p < len(b) {
					b[p] = "changed"
				}
			}
		}
		if edits > 0 {
			// Below maxEdits the script is a shortest one.
			changed := 0
			for _, o := range editScript(a, b) {
				if o.kind != ' ' {
					changed++
				}
			}
			if want := len(a) + len(b) - 2*lcs(a, b); changed != want {
				t.Fatalf("case %d: %d lines changed, the shortest script has %d", i, changed, want)
			}
		}
		as, bs := strings.Join(a, "\n"), strings.Join(b, "\n")
		if r.IntN(2) == 0 && as != "" {
			as += "\n"
		}
		if r.IntN(2) == 0 && bs != "" {
			bs += "\n"
		}
		d := unified("a", "b", as, bs)
		f := filepath.Join(dir, "f")
		os.WriteFile(f, []byte(as), 0o644)
		os.WriteFile(f+".diff", []byte(d), 0o644)
		if d == "" {
			if as != bs {
				t.Fatalf("case %d: no diff of different texts", i)
			}
			continue
		}
		if out, err := exec.Command(patch, "-s", "-o", f+".out", f, f+".diff").CombinedOutput(); err != nil {
			t.Fatalf("case %d: patch: %v\n%s\ndiff:\n%s", i, err, out, d)
		}
		got, _ := os.ReadFile(f + ".out")
		if string(got) != bs {
			t.Fatalf("case %d: the diff applied gives\n%q\nwant\n%q\ndiff:\n%s", i, got, bs, d)
		}
	}
}

// lcs is the length of the longest common subsequence of a and b.
func lcs(a, b []string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			if a[i] == b[j] {
				cur[j+1] = prev[j] + 1
			} else {
				cur[j+1] = max(cur[j], prev[j+1])
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
