// Command gotest runs `go test -json` with the arguments it is given and
// prints what a CI log needs: one line per package, the output of each
// failed test, every skipped test with its reason, and the counts at the
// end. It fails when go test fails and when a test skips for a reason not
// in the allowlist below: on a root machine after `make deps` the only
// skips are those for absent optional kernel features (docs/install.md,
// "What make test runs").
//
//	go run ./internal/gotest [go test flags] [packages]
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"time"
)

// allowedSkips are the skip reasons that do not fail the run, each for a
// kernel feature the suite can do without. Keep it short: any other skip
// means the machine lacks something `make deps` installs, or a test hides
// a failure.
var allowedSkips = []struct {
	reason *regexp.Regexp
	why    string
}{
	{regexp.MustCompile(`eBPF unavailable`), "no eBPF (kernel config or lockdown): the inspector's fallback runs instead"},
	{regexp.MustCompile(`the kernel removed the empty qgroup itself`), "kernels that drop empty btrfs qgroups themselves leave nothing to prune"},
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time       time.Time
	Action     string
	Package    string
	Test       string
	Elapsed    float64
	Output     string
	ImportPath string // build-output, build-fail
}

// skip is a skipped test and why.
type skip struct {
	pkg, test, reason string
	allowed           string // why it is allowed, "" when it is not
}

// report is what a run's events add up to.
type report struct {
	w       io.Writer
	out     map[string][]string // output lines by package and test
	build   map[string][]string // build output by import path
	passed  int
	failed  int
	skips   []skip
	pkgFail int      // packages that failed
	recap   []string // one line per failed test or package, printed again at the end
}

func newReport(w io.Writer) *report {
	return &report{w: w, out: map[string][]string{}, build: map[string][]string{}}
}

func key(pkg, test string) string { return pkg + "\x00" + test }

// noise are test2json's own framing lines, left out of what is printed.
var noise = regexp.MustCompile(`^\s*=== (RUN|PAUSE|CONT|NAME)\b`)

// summary are go test's own result lines of a package, which the
// package's line already says.
var summary = regexp.MustCompile(`^(FAIL|PASS|ok)(\s|$)`)

// add takes one event.
func (r *report) add(e event) {
	switch e.Action {
	case "build-output":
		r.build[e.ImportPath] = append(r.build[e.ImportPath], e.Output)
	case "build-fail":
		fmt.Fprintf(r.w, "BUILD FAIL %s\n", e.ImportPath)
		for _, l := range r.build[e.ImportPath] {
			fmt.Fprint(r.w, l)
		}
	case "output":
		if !noise.MatchString(e.Output) {
			k := key(e.Package, e.Test)
			r.out[k] = append(r.out[k], e.Output)
		}
	case "pass", "fail", "skip":
		if e.Test == "" {
			r.endPackage(e)
			return
		}
		k := key(e.Package, e.Test)
		switch e.Action {
		case "pass":
			r.passed++
		case "fail":
			r.failed++
			fmt.Fprintf(r.w, "--- FAIL %s %s (%.2fs)\n", e.Package, e.Test, e.Elapsed)
			r.recap = append(r.recap, recapLine(e.Package, e.Test, r.out[k]))
			for _, l := range r.out[k] {
				fmt.Fprint(r.w, "    ", strings.TrimLeft(l, " "))
			}
		case "skip":
			r.skips = append(r.skips, r.skipOf(e.Package, e.Test, r.out[k]))
		}
		delete(r.out, k)
	}
}

// endPackage prints a package's result line and, when it failed outside
// any test (a panic in TestMain, a timeout, a setup error), its output.
func (r *report) endPackage(e event) {
	k := key(e.Package, "")
	switch e.Action {
	case "pass":
		fmt.Fprintf(r.w, "ok   %s %.1fs\n", e.Package, e.Elapsed)
	case "skip":
		fmt.Fprintf(r.w, "?    %s [no test files]\n", e.Package)
	case "fail":
		r.pkgFail++
		fmt.Fprintf(r.w, "FAIL %s %.1fs\n", e.Package, e.Elapsed)
		if !r.testFailedIn(e.Package) {
			r.recap = append(r.recap, recapLine(e.Package, "", r.out[k]))
		}
		for _, l := range r.out[k] {
			if !summary.MatchString(l) {
				fmt.Fprint(r.w, "    ", l)
			}
		}
		// Tests still running when the package failed (a -timeout panic
		// is reported in the test it interrupted, which never ends):
		// their output, the panic's goroutine dump included.
		var running []string
		for rk := range r.out {
			if pkg, test, ok := strings.Cut(rk, "\x00"); ok && pkg == e.Package && test != "" {
				running = append(running, rk)
			}
		}
		sort.Strings(running)
		for _, rk := range running {
			_, test, _ := strings.Cut(rk, "\x00")
			fmt.Fprintf(r.w, "--- NO RESULT %s %s (still running when the package failed)\n", e.Package, test)
			r.recap = append(r.recap, recapLine(e.Package, test+" (no result)", r.out[rk]))
			for _, l := range r.out[rk] {
				fmt.Fprint(r.w, "    ", l)
			}
			delete(r.out, rk)
		}
	}
	delete(r.out, k)
}

// where is the first line of a test's output that says where it failed
// (t.Errorf and t.Fatalf lines start with file.go:line:, a panic names
// itself).
var where = regexp.MustCompile(`^\s*(\S+\.go:\d+:|panic:)`)

// recapLine is a failed test's line in the closing recap: its name and
// the first line of its output that says where and why, so that a log's
// tail names what failed even when the test's full output scrolled away.
func recapLine(pkg, test string, lines []string) string {
	name := strings.TrimSpace(pkg + " " + test)
	for _, l := range lines {
		if where.MatchString(l) {
			return name + ": " + strings.TrimSpace(l)
		}
	}
	return name
}

// testFailedIn says whether the recap already names a failed test of pkg.
func (r *report) testFailedIn(pkg string) bool {
	for _, l := range r.recap {
		if strings.HasPrefix(l, pkg+" ") {
			return true
		}
	}
	return false
}

// skipOf makes the skip record of a test from its output: the reason is
// what the test logged, without the "--- SKIP" line.
func (r *report) skipOf(pkg, test string, lines []string) skip {
	var reason []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		reason = append(reason, l)
	}
	s := skip{pkg: pkg, test: test, reason: strings.Join(reason, " | ")}
	for _, a := range allowedSkips {
		if a.reason.MatchString(s.reason) {
			s.allowed = a.why
			break
		}
	}
	return s
}

// finish prints the skips and the counts, and returns the number of
// unexpected skips.
func (r *report) finish() (unexpected int) {
	sort.Slice(r.skips, func(i, j int) bool {
		return key(r.skips[i].pkg, r.skips[i].test) < key(r.skips[j].pkg, r.skips[j].test)
	})
	for _, s := range r.skips {
		if s.allowed != "" {
			fmt.Fprintf(r.w, "SKIP (allowed: %s) %s %s: %s\n", s.allowed, s.pkg, s.test, s.reason)
			continue
		}
		unexpected++
		fmt.Fprintf(r.w, "SKIP (unexpected) %s %s: %s\n", s.pkg, s.test, s.reason)
	}
	for _, l := range r.recap {
		fmt.Fprintf(r.w, "FAILED %s\n", l)
	}
	fmt.Fprintf(r.w, "tests: %d passed, %d failed, %d skipped (%d allowed, %d unexpected)\n",
		r.passed, r.failed, len(r.skips), len(r.skips)-unexpected, unexpected)
	return unexpected
}

// run feeds go test's JSON stream to a report and returns the exit code:
// go test's own when it failed, 1 for failures its exit status missed or
// for unexpected skips, else 0. wait is called once the stream ends and
// returns go test's exit error.
func run(stream io.Reader, w io.Writer, wait func() error) int {
	r := newReport(w)
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line) // not JSON: go test's own message
			continue
		}
		r.add(e)
	}
	readErr := sc.Err()
	goTestErr := wait()
	unexpected := r.finish()
	var ee *exec.ExitError
	switch {
	case readErr != nil:
		fmt.Fprintf(w, "gotest: read go test output: %v\n", readErr)
		return 1
	case errors.As(goTestErr, &ee):
		return max(ee.ExitCode(), 1)
	case goTestErr != nil:
		fmt.Fprintf(w, "gotest: go test: %v\n", goTestErr)
		return 1
	case r.failed > 0 || r.pkgFail > 0:
		return 1
	case unexpected > 0:
		fmt.Fprintf(w, "gotest: %d unexpected skip(s): each hides a test; install what it names (make deps) or fix the test\n", unexpected)
		return 1
	}
	return 0
}

func main() {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, append([]string{"test", "-json"}, os.Args[1:]...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gotest: %v\n", err)
		os.Exit(1)
	}
	os.Exit(run(stdout, os.Stdout, cmd.Wait))
}
