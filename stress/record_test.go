package stress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server/protocol"
)

// errorRow is one row of the error table of docs/protocol.md.
type errorRow struct{ retryable, infra bool }

// errorTable reads the error table of docs/protocol.md (code -> retryable,
// infra): the contract every error the server sends is checked against,
// so the test follows the document rather than a copy of it.
func errorTable(path string) (map[string]errorRow, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	row := regexp.MustCompile("^\\| `([a-z_]+)` \\| .* \\| (yes|no) \\| (yes|no) \\|$")
	t := map[string]errorRow{}
	for _, l := range strings.Split(string(b), "\n") {
		if m := row.FindStringSubmatch(l); m != nil {
			t[m[1]] = errorRow{retryable: m[2] == "yes", infra: m[3] == "yes"}
		}
	}
	if len(t) < 10 || t[protocol.CodeInternal] != (errorRow{false, true}) {
		return nil, fmt.Errorf("%s: no error table found (read %d rows)", path, len(t))
	}
	return t, nil
}

// Outcome codes the recorder counts besides the server's error codes.
const (
	codeOK      = "ok"
	codeDropped = "dropped (connection cut by the test)"
	codeLost    = "connection lost"
	codeHang    = "no answer"
)

// expect is what a request may answer. A nil expect accepts only
// success; codes lists the error codes the request may also get (a
// deliberate mistake, a race the test set up); faulted allows an infra
// error because the test injected a fault on that env.
type expect struct {
	codes   []string
	anyUser bool // any error that is not infra
	faulted bool
}

func (e *expect) allows(pe *protocol.Error) bool {
	if e == nil {
		return false
	}
	if slices.Contains(e.codes, pe.Code) {
		return true
	}
	if e.anyUser && !pe.Infra {
		return true
	}
	return e.faulted && pe.Infra
}

// methodStats are one method's counts and latencies.
type methodStats struct {
	codes map[string]int
	lat   []time.Duration // of answered requests
}

// recorder collects every request's outcome and the failures found.
type recorder struct {
	table    map[string]errorRow // docs/protocol.md's error table
	mu       sync.Mutex
	methods  map[string]*methodStats
	faults   map[string]int
	failures []string
	nfail    int
	notes    map[string]int
	logf     func(string, ...any)
}

func newRecorder(table map[string]errorRow, logf func(string, ...any)) *recorder {
	return &recorder{table: table, methods: map[string]*methodStats{}, faults: map[string]int{}, notes: map[string]int{}, logf: logf}
}

func (r *recorder) count(method, code string, lat time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.methods[method]
	if m == nil {
		m = &methodStats{codes: map[string]int{}}
		r.methods[method] = m
	}
	m.codes[code]++
	if lat > 0 {
		m.lat = append(m.lat, lat)
	}
}

// fail records a failure: a broken promise of docs/protocol.md.
func (r *recorder) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.nfail++
	n := r.nfail
	if len(r.failures) < 100 {
		r.failures = append(r.failures, msg)
	}
	r.mu.Unlock()
	if n <= maxLoggedFailures {
		r.logf("FAIL: %s", msg)
	}
}

// maxLoggedFailures bounds the failures logged; past it the clients stop
// (flooded), so that a broken server does not write gigabytes of log in a
// 15-minute run.
const maxLoggedFailures = 200

// flooded reports whether so many requests failed that the run stops.
func (r *recorder) flooded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nfail >= maxLoggedFailures
}

func (r *recorder) fault(kind string) {
	r.mu.Lock()
	r.faults[kind]++
	r.mu.Unlock()
}

func (r *recorder) note(kind string) {
	r.mu.Lock()
	r.notes[kind]++
	r.mu.Unlock()
}

// check classifies err, the outcome of one request (what: the request,
// for the failure message), counts it and records a failure where the
// answer breaks the protocol's promises. It returns the error for the
// caller's bookkeeping.
func (r *recorder) check(method, what string, start time.Time, c *conn, e *expect, err error) error {
	var lat time.Duration // none for what has no latency of its own (a batch's items)
	if !start.IsZero() {
		lat = time.Since(start)
	}
	var pe *protocol.Error
	switch {
	case err == nil:
		r.count(method, codeOK, lat)
	case errors.As(err, &pe):
		r.count(method, pe.Code, lat)
		tx, known := r.table[pe.Code]
		switch {
		case !known:
			r.fail("%s: error code %q is not in docs/protocol.md: %v", what, pe.Code, err)
		case tx.infra != pe.Infra || tx.retryable != pe.Retryable:
			r.fail("%s: %s answered infra=%v retryable=%v, docs/protocol.md says infra=%v retryable=%v: %v",
				what, pe.Code, pe.Infra, pe.Retryable, tx.infra, tx.retryable, err)
		case !e.allows(pe) && pe.Infra:
			r.fail("%s: infra error without an injected fault: %v", what, err)
		case !e.allows(pe):
			r.fail("%s: unexpected error: %v", what, err)
		}
	case c != nil && c.dropped.Load() && (errors.Is(err, arbor.ErrClosed) || isSendErr(err)):
		r.count(method, codeDropped, 0)
	case errors.Is(err, context.DeadlineExceeded):
		r.count(method, codeHang, 0)
		r.fail("%s: no answer within %s", what, lat.Round(time.Second))
	default:
		r.count(method, codeLost, 0)
		r.fail("%s: %v", what, err)
	}
	return err
}

func isSendErr(err error) bool {
	return err != nil && (strings.HasPrefix(err.Error(), "send ") || errors.Is(err, io.EOF))
}

// percentile of sorted durations (p in 0..100).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(float64(len(d)-1) * p / 100)
	return d[i]
}

// report writes the run's figures as markdown.
func (r *recorder) report(w io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(w, "## Requests\n\n| method | requests | p50 | p99 | outcomes |\n| --- | ---: | ---: | ---: | --- |\n")
	names := make([]string, 0, len(r.methods))
	for n := range r.methods {
		names = append(names, n)
	}
	sort.Strings(names)
	total := 0
	for _, n := range names {
		m := r.methods[n]
		sort.Slice(m.lat, func(i, j int) bool { return m.lat[i] < m.lat[j] })
		sum := 0
		var codes []string
		for c, k := range m.codes {
			sum += k
			codes = append(codes, fmt.Sprintf("%s %d", c, k))
		}
		sort.Strings(codes)
		total += sum
		p50, p99 := "-", "-"
		if len(m.lat) > 0 {
			p50, p99 = ms(percentile(m.lat, 50)), ms(percentile(m.lat, 99))
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s |\n", n, sum, p50, p99, strings.Join(codes, ", "))
	}
	fmt.Fprintf(w, "\n%d requests.\n\n## Injected faults\n\n", total)
	writeCounts(w, r.faults)
	fmt.Fprintf(w, "\n## Checks made\n\n")
	writeCounts(w, r.notes)
	fmt.Fprintf(w, "\n## Failures (%d)\n\n", r.nfail)
	for _, f := range r.failures {
		fmt.Fprintf(w, "- %s\n", f)
	}
	if r.nfail > len(r.failures) {
		fmt.Fprintf(w, "- ... and %d more\n", r.nfail-len(r.failures))
	}
}

func writeCounts(w io.Writer, m map[string]int) {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		fmt.Fprintf(w, "none\n")
	}
	for _, k := range keys {
		fmt.Fprintf(w, "- %s: %d\n", k, m[k])
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// TestErrorTable: the table read from docs/protocol.md has every code of
// server/protocol, with the flags protocol.Errorf gives them.
func TestErrorTable(t *testing.T) {
	table, err := errorTable("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{protocol.CodeMalformed, protocol.CodeUnknownMethod, protocol.CodeInvalidParams,
		protocol.CodeBadRequest, protocol.CodeTooLarge, protocol.CodeUnauthorized, protocol.CodeUnknownEnv,
		protocol.CodeUnknownState, protocol.CodeUnknownTask, protocol.CodeTooManyReqs, protocol.CodeTooManyEnvs,
		protocol.CodeShuttingDown, protocol.CodeRestoreFailed, protocol.CodeCheckpointFail, protocol.CodeSandboxFailed,
		protocol.CodeTimeout, protocol.CodeInternal, protocol.CodeEnvLost, protocol.CodeNoSpace} {
		row, ok := table[code]
		e := protocol.Errorf(code, "x")
		if !ok || row.retryable != e.Retryable || row.infra != e.Infra {
			t.Errorf("%s: docs/protocol.md says %+v (listed %v), protocol.Errorf gives retryable=%v infra=%v", code, row, ok, e.Retryable, e.Infra)
		}
	}
}
