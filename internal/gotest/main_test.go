package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// stream writes test2json events, one JSON object a line.
func stream(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

const (
	pkgPass = `{"Action":"pass","Package":"p","Elapsed":0.1}`
	pkgFail = `{"Action":"fail","Package":"p","Elapsed":0.1}`
)

func TestRun(t *testing.T) {
	exit2 := exec.Command("sh", "-c", "exit 2").Run()
	var ee *exec.ExitError
	if !errors.As(exit2, &ee) {
		t.Fatalf("sh exit 2: %v, want an ExitError", exit2)
	}
	tests := []struct {
		name   string
		events string
		goErr  error
		code   int
		want   []string // lines the output must contain
	}{
		{"all pass", stream(
			`{"Action":"run","Package":"p","Test":"TestA"}`,
			`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
			`{"Action":"pass","Package":"p","Test":"TestA"}`,
			pkgPass), nil, 0,
			[]string{"ok   p 0.1s", "tests: 1 passed, 0 failed, 0 skipped (0 allowed, 0 unexpected)"}},
		{"unexpected skip fails", stream(
			`{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: criu 4.x not installed: run make deps\n"}`,
			`{"Action":"output","Package":"p","Test":"TestB","Output":"--- SKIP: TestB (0.00s)\n"}`,
			`{"Action":"skip","Package":"p","Test":"TestB"}`,
			pkgPass), nil, 1,
			[]string{"SKIP (unexpected) p TestB: b_test.go:9: criu 4.x not installed: run make deps",
				"1 skipped (0 allowed, 1 unexpected)", "1 unexpected skip"}},
		{"allowed skip passes", stream(
			`{"Action":"output","Package":"p","Test":"TestC","Output":"    c_test.go:3: eBPF unavailable: no BTF\n"}`,
			`{"Action":"skip","Package":"p","Test":"TestC"}`,
			pkgPass), nil, 0,
			[]string{"SKIP (allowed: no eBPF", "1 skipped (1 allowed, 0 unexpected)"}},
		{"failed test prints its output", stream(
			`{"Action":"output","Package":"p","Test":"TestD","Output":"    d_test.go:5: got 1, want 2\n"}`,
			`{"Action":"fail","Package":"p","Test":"TestD","Elapsed":0.5}`,
			pkgFail), exit1(t), 1,
			[]string{"--- FAIL p TestD (0.50s)", "d_test.go:5: got 1, want 2", "FAIL p 0.1s",
				"FAILED p TestD: d_test.go:5: got 1, want 2\ntests: 0 passed, 1 failed"}},
		{"package failure outside tests prints its output", stream(
			`{"Action":"output","Package":"p","Output":"server tests: set up the engine: no pool\n"}`,
			`{"Action":"output","Package":"p","Output":"FAIL\tp\t0.1s\n"}`,
			pkgFail), nil, 1,
			[]string{"FAIL p 0.1s", "set up the engine: no pool", "FAILED p\ntests:"}},
		{"a test cut off by the timeout is named", stream(
			`{"Action":"output","Package":"p","Test":"TestE","Output":"panic: test timed out after 10m0s\n"}`,
			`{"Action":"output","Package":"p","Test":"TestE","Output":"goroutine 1 [running]:\n"}`,
			pkgFail), exit1(t), 1,
			[]string{"--- NO RESULT p TestE", "goroutine 1 [running]:",
				"FAILED p TestE (no result): panic: test timed out after 10m0s\ntests:"}},
		{"build failure", stream(
			`{"ImportPath":"p","Action":"build-output","Output":"p/x.go:1:1: syntax error\n"}`,
			`{"ImportPath":"p","Action":"build-fail"}`,
			`{"Action":"fail","Package":"p","Elapsed":0,"FailedBuild":"p"}`), nil, 1,
			[]string{"BUILD FAIL p", "syntax error"}},
		{"go test's exit code is kept", stream(pkgPass), exit2, 2, nil},
		{"a non-JSON line is passed through", "no Go files in /x\n", nil, 0, []string{"no Go files in /x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			code := run(strings.NewReader(tt.events), &out, func() error { return tt.goErr })
			if code != tt.code {
				t.Errorf("exit code %d, want %d; output:\n%s", code, tt.code, out.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

func exit1(t *testing.T) error {
	t.Helper()
	err := exec.Command("false").Run()
	if err == nil {
		t.Fatal("false succeeded")
	}
	return err
}
