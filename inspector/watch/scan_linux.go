package watch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/internal/procfs"
)

// DefaultMaxScan bounds what one EndTurn, Settle or Checkpointed reads of
// the sandbox's processes, in entries: a descriptor is one, a line of
// maps (128 bytes counted as one) another. An ordinary sandbox's
// processes hold a few thousand; an agent that opens a million
// descriptors, or maps 65530 areas in each of 512 processes, would
// otherwise make every turn of its env cost the server seconds of CPU
// and hundreds of MiB. Past the bound the turn is not proven to leave
// the processes alone: it counts as unaccounted (a full checkpoint).
const DefaultMaxScan = 1 << 17

// mapsLine is the bytes of a maps file counted as one entry of the scan.
const mapsLine = 128

// scan is one reading of the processes of a sandbox's cgroup, shared by
// the process sample (sampleProcs), the holders of changed files
// (heldFacts) and of stream objects (kernelFacts), so that a turn lists
// the cgroup, and reads each process's status, descriptors and mappings,
// once (docs/inspector.md, "Cost"). Descriptors and mappings are read
// when first asked for, within the scan's budget.
type scan struct {
	procs []*scanned
	err   error // the cgroup could not be listed
	left  int   // entries the budget has left
	max   int
	over  string // what the budget did not cover, when it ran out
}

// scanned is one process of a scan.
type scanned struct {
	pid     int    // on the host
	ns      int    // inside the sandbox; 0 when it is gone
	comm    string // its command name
	pending string // ShdPnd of its status: signals pending for the process

	fdsRead, mapsRead bool
	fds               []fdEntry // its descriptors, by number
	maps              []byte    // its maps file; nil when unreadable
}

// fdEntry is one descriptor of a process: its number and what
// /proc/PID/fd/N links to.
type fdEntry struct {
	fd   int
	link string
}

// newScan lists the processes of the v2 cgroup dir cg and reads each one's
// status (its pid inside the sandbox, its name, its pending signals).
func newScan(cg string, max int) *scan {
	if max <= 0 {
		max = DefaultMaxScan
	}
	s := &scan{left: max, max: max}
	b, err := procfs.ReadFile(filepath.Join(cg, "cgroup.procs"))
	if err != nil {
		s.err = fmt.Errorf("list processes of %s: %w", cg, err)
		return s
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		p := &scanned{pid: pid}
		if st, err := procfs.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
			for _, line := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(line, "Name:"); ok {
					p.comm = strings.TrimSpace(v)
				}
				if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
					if f := strings.Fields(v); len(f) > 0 {
						p.ns, _ = strconv.Atoi(f[len(f)-1])
					}
				}
				if v, ok := strings.CutPrefix(line, "ShdPnd:"); ok {
					p.pending = strings.TrimSpace(v)
				}
			}
		}
		s.procs = append(s.procs, p)
	}
	return s
}

// fdsOf returns p's descriptors, read on the first call; nil (with s.over
// set) past the budget, or when p is gone.
func (s *scan) fdsOf(p *scanned) []fdEntry {
	if p.fdsRead {
		return p.fds
	}
	p.fdsRead = true
	if s.over != "" {
		return nil
	}
	dir := fmt.Sprintf("/proc/%d/fd", p.pid)
	ents, err := procfs.ReadDirNamesMax(dir, s.left)
	if err != nil {
		if errors.Is(err, procfs.ErrTooLarge) {
			s.exhausted(fmt.Sprintf("the descriptors of process %d (%s)", p.pid, p.comm))
		}
		return nil
	}
	s.left -= len(ents)
	for _, e := range ents {
		fd, err := strconv.Atoi(e)
		if err != nil {
			continue
		}
		link, err := os.Readlink(dir + "/" + e)
		if err != nil {
			continue // closed meanwhile
		}
		p.fds = append(p.fds, fdEntry{fd, link})
	}
	return p.fds
}

// mapsOf returns p's maps file, read on the first call; nil past the
// budget, or when p is gone.
func (s *scan) mapsOf(p *scanned) []byte {
	if p.mapsRead {
		return p.maps
	}
	p.mapsRead = true
	if s.over != "" {
		return nil
	}
	b, err := procfs.ReadFileMax(fmt.Sprintf("/proc/%d/maps", p.pid), s.left*mapsLine)
	if err != nil {
		if errors.Is(err, procfs.ErrTooLarge) {
			s.exhausted(fmt.Sprintf("the mappings of process %d (%s)", p.pid, p.comm))
		}
		return nil
	}
	s.left -= (len(b) + mapsLine - 1) / mapsLine
	p.maps = b
	return b
}

func (s *scan) exhausted(what string) {
	s.left = 0
	s.over = fmt.Sprintf("%s are past the turn's scan bound (%d descriptors and mapping lines): the processes are not proven unchanged", what, s.max)
}

// overFact is the fact of a scan whose budget ran out, if it did.
func (s *scan) overFact() []inspector.Fact {
	if s.over == "" {
		return nil
	}
	return []inspector.Fact{{Kind: inspector.Unaccounted, Detail: s.over}}
}
