package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/capability"
)

// Isolation is the in-kernel hardening of a sandbox (docs/sandbox.md,
// "Isolation"): capabilities, no_new_privs, a seccomp filter, masked and
// read-only /proc paths and a devices cgroup. The zero value is the
// hardened default: Docker's capability set and Docker's seccomp profile.
type Isolation struct {
	// Unhardened turns all of it off: every capability, no seccomp
	// filter, /proc as the kernel shows it. Only for measuring what the
	// hardening costs and for debugging; never for untrusted code.
	Unhardened bool
	// Caps are the capabilities the sandbox's processes keep, by name
	// ("CAP_CHOWN" or "chown"); empty means DefaultCaps. A task may ask
	// for fewer; more than DefaultCaps is refused unless AllowExtraCaps.
	Caps []string
	// AllowExtraCaps lets Caps name capabilities beyond DefaultCaps (the
	// server's --allow-extra-caps).
	AllowExtraCaps bool
}

// DefaultCaps is Docker's default capability set, what a sandbox keeps
// unless its task asks for fewer.
var DefaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
	"CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
}

// CapSet is a set of capabilities as a bit mask (bit n is capability n),
// the form /proc/PID/status shows.
type CapSet uint64

// ParseCaps turns capability names into a set. Names are case-insensitive,
// with or without the CAP_ prefix.
func ParseCaps(names []string) (CapSet, error) {
	var s CapSet
	for _, n := range names {
		c, ok := capByName(n)
		if !ok {
			return 0, fmt.Errorf("%w: unknown capability %q", ErrIsolation, n)
		}
		s |= 1 << uint(c)
	}
	return s, nil
}

func capByName(n string) (capability.Cap, bool) {
	n = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(n)), "cap_")
	for _, c := range capability.ListKnown() {
		if c.String() == n {
			return c, true
		}
	}
	return 0, false
}

// Names lists the set's capabilities as CAP_ names, in bit order.
func (s CapSet) Names() []string {
	var out []string
	for _, c := range capability.ListKnown() {
		if s.Has(int(c)) {
			out = append(out, "CAP_"+strings.ToUpper(c.String()))
		}
	}
	return out
}

// Has reports whether capability number c is in the set.
func (s CapSet) Has(c int) bool { return c >= 0 && c < 64 && s&(1<<uint(c)) != 0 }

// SubsetOf reports whether every capability of s is in o.
func (s CapSet) SubsetOf(o CapSet) bool { return s&^o == 0 }

func (s CapSet) String() string { return fmt.Sprintf("%016x", uint64(s)) }

// defaultCapSet is DefaultCaps as a set.
var defaultCapSet = func() CapSet {
	s, err := ParseCaps(DefaultCaps)
	if err != nil {
		panic(err)
	}
	return s
}()

// KeptCaps resolves the capabilities a sandbox with this isolation keeps:
// DefaultCaps when Caps is empty, else Caps, which may not go beyond
// DefaultCaps unless AllowExtraCaps. An unhardened sandbox keeps all.
func (i Isolation) KeptCaps() (CapSet, error) {
	if i.Unhardened {
		return allCaps(), nil
	}
	if len(i.Caps) == 0 {
		return defaultCapSet, nil
	}
	s, err := ParseCaps(i.Caps)
	if err != nil {
		return 0, err
	}
	if extra := s &^ defaultCapSet; extra != 0 && !i.AllowExtraCaps {
		return 0, fmt.Errorf("%w: capabilities %s are beyond the default set; the server must run with --allow-extra-caps to grant them",
			ErrIsolation, strings.Join(extra.Names(), ", "))
	}
	return s, nil
}

// allowedCaps is the most a sandbox under this policy may hold.
func (i Isolation) allowedCaps() CapSet {
	if i.Unhardened || i.AllowExtraCaps {
		return allCaps()
	}
	return defaultCapSet
}

// allCaps is every capability this package knows.
func allCaps() CapSet {
	var s CapSet
	for _, c := range capability.ListKnown() {
		s |= 1 << uint(c)
	}
	return s
}

// TaskIsolation is what /proc/PID/status says about one task's isolation.
type TaskIsolation struct {
	CapInh, CapPrm, CapEff, CapBnd, CapAmb CapSet
	NoNewPrivs                             int
	// Seccomp is the mode: 0 none, 1 strict, 2 filter.
	Seccomp        int
	SeccompFilters int
}

// ParseTaskIsolation reads the isolation fields of a /proc/PID/status text.
// Every field must be present (Seccomp_filters since Linux 5.9).
func ParseTaskIsolation(status []byte) (TaskIsolation, error) {
	var t TaskIsolation
	caps := map[string]*CapSet{"CapInh": &t.CapInh, "CapPrm": &t.CapPrm, "CapEff": &t.CapEff, "CapBnd": &t.CapBnd, "CapAmb": &t.CapAmb}
	ints := map[string]*int{"NoNewPrivs": &t.NoNewPrivs, "Seccomp": &t.Seccomp, "Seccomp_filters": &t.SeccompFilters}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if p, ok := caps[k]; ok {
			var n uint64
			if _, err := fmt.Sscanf(v, "%x", &n); err != nil || len(v) != 16 {
				return t, fmt.Errorf("%w: status field %s: %q is not a capability mask", ErrIsolation, k, v)
			}
			*p = CapSet(n)
			seen[k] = true
		}
		if p, ok := ints[k]; ok {
			var n int
			if _, err := fmt.Sscanf(v, "%d", &n); err != nil {
				return t, fmt.Errorf("%w: status field %s: %q is not a number", ErrIsolation, k, v)
			}
			*p = n
			seen[k] = true
		}
	}
	var missing []string
	for _, m := range []map[string]bool{keys(caps), keys(ints)} {
		for k := range m {
			if !seen[k] {
				missing = append(missing, k)
			}
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return t, fmt.Errorf("%w: status lacks %s", ErrIsolation, strings.Join(missing, ", "))
	}
	return t, nil
}

func keys[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func (t TaskIsolation) String() string {
	return fmt.Sprintf("CapInh=%s CapPrm=%s CapEff=%s CapBnd=%s CapAmb=%s NoNewPrivs=%d Seccomp=%d Seccomp_filters=%d",
		t.CapInh, t.CapPrm, t.CapEff, t.CapBnd, t.CapAmb, t.NoNewPrivs, t.Seccomp, t.SeccompFilters)
}

// IsolationRecord is what a sandbox's init and shell held at one moment:
// taken when it starts and at every dump (stored next to the process
// image), and compared with what every restore brings back.
type IsolationRecord struct {
	Hardened bool `json:"hardened"`
	// Caps is the set the sandbox was started to keep.
	Caps CapSet `json:"caps"`
	// Init is pid 1; Shell the persistent shell, whose pid inside the
	// sandbox is ShellPID (0: not recorded).
	Init     TaskIsolation `json:"init"`
	ShellPID int           `json:"shell_pid,omitempty"`
	Shell    TaskIsolation `json:"shell"`
}

// checkTask says what is wrong with one task of a hardened sandbox that
// was started to keep caps: every set within caps, nothing ambient,
// no_new_privs and a seccomp filter. exact also requires the permitted,
// effective, inheritable and bounding sets to be caps itself (init never
// changes its own).
func checkTask(who string, t TaskIsolation, caps CapSet, exact bool) error {
	var bad []string
	for _, f := range []struct {
		name string
		v    CapSet
	}{{"CapInh", t.CapInh}, {"CapPrm", t.CapPrm}, {"CapEff", t.CapEff}, {"CapBnd", t.CapBnd}} {
		if exact && f.v != caps || !f.v.SubsetOf(caps) {
			bad = append(bad, fmt.Sprintf("%s=%s (want %s)", f.name, f.v, caps))
		}
	}
	if t.CapAmb != 0 {
		bad = append(bad, fmt.Sprintf("CapAmb=%s (want none)", t.CapAmb))
	}
	if t.NoNewPrivs != 1 {
		bad = append(bad, fmt.Sprintf("NoNewPrivs=%d (want 1)", t.NoNewPrivs))
	}
	if t.Seccomp != 2 || t.SeccompFilters < 1 {
		bad = append(bad, fmt.Sprintf("Seccomp=%d Seccomp_filters=%d (want mode 2, a filter)", t.Seccomp, t.SeccompFilters))
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s: %s", ErrIsolation, who, strings.Join(bad, ", "))
	}
	return nil
}

// CheckPolicy reports whether the record satisfies the policy: a hardened
// policy wants a hardened record whose kept set is within what the policy
// allows, init holding exactly that set and the shell at most it, both
// with no_new_privs and a seccomp filter. An unhardened policy accepts any
// record.
func (r IsolationRecord) CheckPolicy(p Isolation) error {
	if p.Unhardened {
		return nil
	}
	if !r.Hardened {
		return fmt.Errorf("%w: the sandbox is unhardened, the policy wants it hardened", ErrIsolation)
	}
	if !r.Caps.SubsetOf(p.allowedCaps()) {
		return fmt.Errorf("%w: the sandbox keeps %s, beyond what the policy allows (%s)", ErrIsolation,
			strings.Join((r.Caps&^p.allowedCaps()).Names(), ", "), strings.Join(p.allowedCaps().Names(), ", "))
	}
	if err := checkTask("init", r.Init, r.Caps, true); err != nil {
		return err
	}
	if r.ShellPID != 0 {
		if err := checkTask(fmt.Sprintf("shell (pid %d)", r.ShellPID), r.Shell, r.Caps, false); err != nil {
			return err
		}
		if r.Shell.SeccompFilters < r.Init.SeccompFilters {
			return fmt.Errorf("%w: shell has %d seccomp filters, init %d", ErrIsolation, r.Shell.SeccompFilters, r.Init.SeccompFilters)
		}
	}
	return nil
}

// Matches reports whether what a restore brought back (got) equals the
// record taken at the dump: the same fields for init and, when the dump
// recorded the shell, for the same pid.
func (r IsolationRecord) Matches(got IsolationRecord) error {
	if got.Init != r.Init {
		return fmt.Errorf("%w: restored init has %v, the dump recorded %v", ErrIsolation, got.Init, r.Init)
	}
	if r.ShellPID != 0 && got.ShellPID != r.ShellPID {
		return fmt.Errorf("%w: the restored tree has no shell with pid %d, which the dump recorded", ErrIsolation, r.ShellPID)
	}
	if r.ShellPID != 0 && got.Shell != r.Shell {
		return fmt.Errorf("%w: restored shell (pid %d) has %v, the dump recorded %v", ErrIsolation, r.ShellPID, got.Shell, r.Shell)
	}
	return nil
}

// IsolationFile is the name of the record a checkpoint writes next to its
// process image.
const IsolationFile = "arbor-isolation.json"

// WriteIsolationRecord stores r in dir (a process image directory).
func WriteIsolationRecord(dir string, r IsolationRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode isolation record: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, IsolationFile), b, 0o600); err != nil {
		return fmt.Errorf("write isolation record: %w", err)
	}
	return nil
}

// ReadIsolationRecord reads the record a checkpoint stored in dir. An image
// without one (made before records existed) is an ErrIsolation: nothing
// says what its processes may hold.
func ReadIsolationRecord(dir string) (IsolationRecord, error) {
	var r IsolationRecord
	b, err := os.ReadFile(filepath.Join(dir, IsolationFile))
	if errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("%w: process image %s has no isolation record", ErrIsolation, dir)
	}
	if err != nil {
		return r, fmt.Errorf("read isolation record: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: isolation record of %s: %v", ErrIsolation, dir, err)
	}
	return r, nil
}
