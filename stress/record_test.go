package stress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server/protocol"
)

// taxonomy is the error table of docs/protocol.md: code -> retryable,
// infra. Every error the server sends must be in it with these flags.
var taxonomy = map[string]struct{ retryable, infra bool }{
	protocol.CodeMalformed:      {false, false},
	protocol.CodeUnknownMethod:  {false, false},
	protocol.CodeInvalidParams:  {false, false},
	protocol.CodeBadRequest:     {false, false},
	protocol.CodeTooLarge:       {false, false},
	protocol.CodeUnauthorized:   {false, false},
	protocol.CodeUnknownEnv:     {false, false},
	protocol.CodeUnknownState:   {false, false},
	protocol.CodeUnknownTask:    {false, false},
	protocol.CodeTooManyReqs:    {true, false},
	protocol.CodeTooManyEnvs:    {true, false},
	protocol.CodeShuttingDown:   {true, true},
	protocol.CodeRestoreFailed:  {true, true},
	protocol.CodeCheckpointFail: {true, true},
	protocol.CodeSandboxFailed:  {true, true},
	protocol.CodeTimeout:        {true, true},
	protocol.CodeInternal:       {false, true},
	protocol.CodeEnvLost:        {false, true},
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
	mu       sync.Mutex
	methods  map[string]*methodStats
	faults   map[string]int
	failures []string
	nfail    int
	notes    map[string]int
	logf     func(string, ...any)
}

func newRecorder(logf func(string, ...any)) *recorder {
	return &recorder{methods: map[string]*methodStats{}, faults: map[string]int{}, notes: map[string]int{}, logf: logf}
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
	if len(r.failures) < 100 {
		r.failures = append(r.failures, msg)
	}
	r.mu.Unlock()
	r.logf("FAIL: %s", msg)
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
	lat := time.Since(start)
	var pe *protocol.Error
	switch {
	case err == nil:
		r.count(method, codeOK, lat)
	case errors.As(err, &pe):
		r.count(method, pe.Code, lat)
		tx, known := taxonomy[pe.Code]
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
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s |\n", n, sum, ms(percentile(m.lat, 50)), ms(percentile(m.lat, 99)), strings.Join(codes, ", "))
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
